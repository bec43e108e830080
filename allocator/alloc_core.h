/* SPDX-License-Identifier: Apache-2.0 */
/* alloc_core.h - the caching allocator's structures: blocks, segments, pools,
 * the per-device allocator, and the module map of the files that build them.
 *
 * One idea runs through it: device memory is obtained in segments and carved
 * into blocks that tile each segment; a free block lives in exactly one place,
 * its pool's free tree, keyed (stream, size, address), so that the best fit is
 * a single O(log n) search and the cached alloc/free pair touches no list and
 * makes no device call. The one exception is the free cache (Note [Free
 * cache], fcache.c): a plain free may wait, uncoalesced and out of the tree,
 * in its (stream, pool)'s slot for the next request of that size.
 *
 * Module map, top floor first; a file calls only the files below it (the
 * prototypes further down are grouped by the file that defines them):
 *   pool.c       private pools: handles, use counts and their public API
 *   checkpoint.c checkpoint and restore of a private pool's block layout
 *   ipc.c        export and import of live blocks between processes
 *   snapshot.c   snapshots (JSON) of segments, blocks and history
 *   free_blocks.c gca_get_free_blocks: free bytes and the largest free block
 *   check.c      the invariant walker and the read-only walk for snapshots
 *   allocator.c  the device registry and the public entry points (malloc, free,
 *                settings, empty_cache, limits, OOM observers,
 *                teardown); the cache-hit fast paths, inline
 *   uses.c       record_stream and pointer_info: the calls on one live block; bad pointers
 *   stats.c      the statistics read (made whole) and reset
 *   route.c      routes to private pools: stream filters, thread scopes,
 *                captures; the choice of pool for a request
 *   release.c    a new block when the cache has none: garbage collection, a
 *                new segment, the out-of-memory retries; release_cached;
 *                release batches run; the reap (dying pools, caching off)
 *   pending.c    frees that wait for events of other streams or for a
 *                capture's end, and the per-device event pools
 *   recycle.c    the recycle bins: small plain frees kept by (stream, size),
 *                off PyTorch's placement (recycle_bins:True); flushing every cache
 *   fcache.c     the free cache (fcache.h: its hit and put, inline)
 *   tcache.c     the thread caches: each thread's frees cached without the device
 *                lock (tcache.h: the take and the put, inline); blocks entering and
 *                leaving them, their lives
 *   tcstats.c    the thread caches' statistics: folds, headroom, exact peaks
 *   blocks.c     blocks in their pool: best fit, activate (split), complete a
 *                free (coalesce)
 *   mempool.c    a private pool's memory over its life: left for the reap once
 *                dying and idle, suspend and resume, its bytes, teardown
 *   segment.c    classic segments (mem_alloc, or VMM-backed with ipc_handles);
 *                which kind a new segment is; releasing and destroying one
 *   expandable.c expandable segments: one reservation per (stream, pool),
 *                mapped as it grows (one handle per granule in the device's
 *                pools, handles of free granules moved before new ones are
 *                made), unmapped when released
 *   vmm.c        the VMM driver side: granularity, access list, map/unmap
 *   freetree.c   the free structure of a pool (an intrusive treap)
 *   ptrmap.c     the per-device pointer -> block map, and the lock-free map from
 *                address granules to devices that lets a free find its device
 *   slab.c       block records: slabs, reserve, take, free
 *   sizes.c      size rules: rounding, segment sizes, split and fit rules, the
 *                memory limit
 *   streamkey.c  the allocator's key for a stream handle (per-thread streams)
 *   config.c, history.c  settings; history and trace recording (any floor)
 *
 * Who calls whom (an edge is a call down; the graph, read from the objects'
 * symbols, has no cycle):
 *   pool.c       -> allocator.c (registry), route.c, mempool.c, release.c (reap)
 *   checkpoint.c -> pool.c (lookup), route.c, release.c, pending.c, expandable.c,
 *                   slab.c, freetree.c, ptrmap.c
 *   ipc.c        -> allocator.c (gca__lock_live)
 *   snapshot.c   -> check.c, allocator.c
 *   free_blocks.c -> check.c (the walk)
 *   check.c      -> allocator.c, stats.c, pool.c (the pools' own checks), fcache.h,
 *                   recycle.c, tcache.c, tcstats.c, expandable.c, freetree.c, ptrmap.c
 *   stats.c      -> allocator.c (registry), tcstats.c (folds)
 *   uses.c       -> allocator.c (gca__lock_live), tcache.c, streamkey.c
 *   allocator.c  -> route.c, release.c, pending.c, recycle.c, fcache.c, tcache.c,
 *                   blocks.c, mempool.c (OOM report, teardown), segment.c (teardown),
 *                   expandable.c (peer access), slab.c, sizes.c, ptrmap.c
 *   route.c      -> pending.c (a capture's end), mempool.c
 *   release.c    -> pending.c, recycle.c, fcache.c, tcache.c, blocks.c, mempool.c,
 *                   segment.c, expandable.c
 *   pending.c    -> fcache.c, blocks.c
 *   recycle.c    -> fcache.c (evictions, its flush), tcache.c (declines), blocks.c, ptrmap.c
 *   fcache.c     -> tcache.c (evictions), blocks.c, freetree.c (exact hits), ptrmap.c
 *   tcache.c     -> tcstats.c, blocks.c, ptrmap.c
 *   blocks.c     -> mempool.c, segment.c, freetree.c, slab.c, sizes.c
 *   mempool.c    -> segment.c, vmm.c
 *   segment.c    -> expandable.c, vmm.c, slab.c, sizes.c, ptrmap.c, freetree.c
 *   expandable.c -> vmm.c, slab.c, sizes.c, freetree.c, ptrmap.c
 *   vmm.c, freetree.c, ptrmap.c, slab.c, sizes.c, streamkey.c -> the device
 *                   layer only (every floor may call streamkey.c, and tcstats.c
 *                   through the statistics helpers below; it calls nothing)
 * A gca_malloc that misses the free cache: allocator.c (gca_malloc_device,
 * dev_malloc_locked) -> route.c (only while a route exists) -> pending.c
 * (gca__pending_process, only when events are pending) -> fcache.c
 * (gca__fcache_evict_slot) -> blocks.c (gca__pool_take_fit); when nothing fits ->
 * release.c (gca__release_new_block) -> segment.c (gca__segment_alloc) ->
 * expandable.c and/or vmm.c -> the device layer; then blocks.c
 * (gca__block_activate) makes the block active.
 *
 * Notes (name: the file that holds it):
 *   Statistics, Active statistics  alloc_core.h
 *   Free cache, Exact hits, Free cache epochs, Free cache waste  fcache.c
 *   Thread caches                  tcache.c
 *   Recycle bins                   recycle.c
 *   Stream-ordered reuse           pending.c
 *   Tree places                    blocks.c
 *   VMM-backed classic segments    segment.c
 *   Expandable segments            expandable.c
 *   Frees during capture           pending.c
 *   Checkpoints                    checkpoint.c (and DESIGN.md)
 *   Checkpoints and stream uses    checkpoint.c
 *   Per-thread stream keys         streamkey.c
 *   No waits under the device lock below, and release.c (release batches)
 *
 * Note [No waits under the device lock]. A host function queued on a stream
 * may call gca_free, which takes the device lock; so a thread that holds the
 * lock and waits for queued work (event_synchronize, stream_synchronize,
 * ctx_synchronize, mem_free, which synchronizes the device as cuMemFree does)
 * can wait for a host function that waits for the lock: nothing moves. The
 * rule: no device-layer call that can wait for queued work is made with
 * d->lock held. What is to be given back is taken out of reach under the lock
 * (a release batch: its free blocks leave the tree, marked `releasing`, and
 * stay counted in reserved, so the limit and the OOM message stay right), the
 * lock is let go for the waits and driver frees, and retaken to finish the
 * accounting and the history (release.c). Pending events are waited for the
 * same way: snapshot, unlock, wait, relock, then complete by queries
 * (pending.c). An allocation that runs out of memory while another thread
 * releases waits for that release (rel_cv, no device lock held) and retries.
 * GCA_DEBUG_CHECKS builds count the device locks each thread holds (lock.h)
 * and the sim's waiting operations abort when the count is not zero. What a
 * free makes releasable deep in its call (a dying private pool now idle, a
 * whole free segment with caching off) cannot let the lock go there: the free
 * sets d->reap and the entry point's unlock (gca__dev_unlock) gives it back
 * through release batches (gca__release_reap, release.c). A free with caching
 * off waits for the block's other streams before it, the lock let go
 * (allocator.c). Checkpoint restore's trim is a release batch (checkpoint.c).
 * Pool suspend and resume (and so a dying suspended pool's destruction, which
 * resumes it first) mark the pool busy and let the lock go for their device
 * work (Note [Suspend and resume with the lock let go], mempool.c). No path
 * waits under the lock.
 */
#ifndef GCA_ALLOC_CORE_H
#define GCA_ALLOC_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "config.h"
#include "lock.h"
#include "device.h"
#include "history.h"
#include "gca/allocator.h"
#include "gca/pool.h"

/* PyTorch's size constants (CUDACachingAllocator.cpp). */
#define GCA__MIN_BLOCK_SIZE  ((size_t)512)      /* all sizes are rounded to this */
#define GCA__SMALL_SIZE      ((size_t)1 << 20)  /* largest request of the small pool */
#define GCA__SMALL_BUFFER    ((size_t)2 << 20)  /* small pool segment size */
#define GCA__LARGE_BUFFER    ((size_t)20 << 20) /* segment size for 1 MiB < r < 10 MiB */
#define GCA__MIN_LARGE_ALLOC ((size_t)10 << 20) /* from here segments are sized to fit */
#define GCA__ROUND_LARGE     ((size_t)2 << 20)  /* ...rounded up to this */
#define GCA__MAX_REQUEST     ((size_t)1 << 62)  /* beyond any device; rounding cannot overflow */
#define GCA__MAX_DEVICES     64

typedef struct gca__block gca__block_t;

/* A stream a block was used on (gca_record_stream) and the device the stream
 * belongs to; a NULL stream is that device's legacy stream. */
typedef struct gca__use {
  gca_stream_t stream;
  int dev;
} gca__use_t;
typedef struct gca__segment gca__segment_t;
typedef struct gca__pool gca__pool_t;
typedef struct gca__devalloc gca__devalloc_t;
typedef struct gca__mempool gca__mempool_t;
typedef struct gca__route gca__route_t;
typedef struct gca__tcache gca__tcache_t;

/* A block: a contiguous piece of a segment.
 * Invariants (checked by gca__allocator_check):
 *   prev/next are the address-order neighbours in the same segment, and
 *   prev->addr + prev->size == addr; the blocks of a segment tile it exactly.
 *   allocated                      -> in the pointer map, not in the free tree
 *   !allocated && event_count > 0  -> pending free: in neither (Note [Stream-ordered reuse])
 *   cached                         -> freed into the free cache: not allocated, in
 *                                     the pointer map and a cache slot, in no tree
 *                                     (Note [Free cache], fcache.c)
 *   binned                         -> in a recycle bin (Note [Recycle bins]): not
 *                                     allocated, in the pointer map, in no tree, no uses
 *   !allocated && event_count == 0 -> in its pool's free tree (in_tree), and
 *     && !cached && !binned           neither neighbour is also in it (coalesced);
 *                                     no uses array (Note [Record lines])
 *   uses == NULL <-> cap_uses == 0, and nuses <= cap_uses
 *   tc != NULL                     -> allocated, no uses, in a classic segment of a default
 *                                     pool, in the pointer map and tc's table; free for the
 *                                     statistics while cached there, and fc_blocks/fc_bytes
 *                                     hold; unless tc_apart, no other held block within two
 *                                     places (Note [Thread caches], [Thread cache runs])
 *   stream == seg->stream, pool == seg->pool.
 */
struct gca__block {
  /* first cache line: what a free-tree descent reads, and all that the merge
   * reads and writes of a free neighbour (records are aligned to it, see
   * slab.c; Note [Record lines]) */
  _Alignas(64) gca_devptr_t addr;
  size_t size;
  gca__block_t *left, *right; /* free tree links */
  gca__block_t *parent;       /* free tree: NULL at a root (Note [Free bins]) */
  gca__block_t *prev, *next;  /* address neighbours within the segment */
  uint32_t prio;              /* free tree heap priority */
  bool allocated;
  bool in_tree;
  bool cached;   /* in the free cache (Note [Free cache]); bin link: left */
  bool unmapped; /* expandable segments only: address space with no memory behind it;
                    never allocated, never in the tree, never next to another unmapped
                    block, both ends on the granularity (Note [Expandable segments]) */
  /* second line: what a free or an allocation of the block itself reads */
  gca_stream_t stream; /* the allocation stream (the segment's) */
  size_t requested;    /* the caller's size while active, else 0 */
  gca__pool_t *pool;
  gca__segment_t *seg;
  gca__tcache_t *tc;        /* the thread cache whose domain holds b, else NULL (Note [Thread
                               caches]); set and cleared with d->lock and tc's lock held. While
                               set, whether b is cached there and its requested size are the
                               cache's (gca__tc_cached, gca__tc_requested), not b's */
  uint32_t nuses, cap_uses; /* uses recorded, and the room in `uses` (0 when NULL) */
  uint32_t event_count;     /* pending events before the block is free */
  bool releasing;           /* free, but taken out of the tree by a release batch that is waiting
                               with the lock let go (Note [No waits under the device lock]) */
  bool oversize;            /* counted in oversize_allocations at allocation */
  bool binned;              /* in a recycle bin (Note [Recycle bins]); bin link: left */
  bool tc_apart;            /* with tc: counted as a free run of its own while cached, not
                               merged with its neighbours (Note [Thread cache runs]) */
  uint64_t gc_base;         /* pool->free_calls when it became free (GC age; in expandable
                               segments its move stamp, Note [Move horizons]) */
  /* the rest: stream uses, the free cache's and the thread caches' */
  gca__use_t *uses;  /* other streams recorded with gca_record_stream; NULL while the block
                        is free (Note [Record lines]) */
  int32_t fc_blocks; /* cached: its (inactive_split, _bytes) change when cached */
  int64_t fc_bytes;
  uint64_t fc_epoch; /* == the device's epoch: fc_blocks/fc_bytes hold for a free now and no
                        cached block is near (Note [Free cache epochs]) */
  uint64_t fc_gen;   /* the pool's gen when fc_exact was found (Note [Exact hits]) */
  uint8_t fc_exact;  /* GCA__FC_EXACT_*: whether a hit on it is PyTorch's best fit, while
                        its pool's gen is fc_gen */
  /* while tc is set (written with d->lock and tc's lock held): its slot in
   * tc's table (keys[tc_slot] == addr), its bin (gca__tc_bin of its stream
   * and size) and its type index (0 small, 1 large), so that the fast paths
   * find them without hashing */
  uint8_t tc_slot, tc_bin, tc_ti;
};

/* One physical allocation mapped into an expandable segment: the handle
 * (mem_create of exactly `size` bytes) is mapped whole at base + offset. */
typedef struct gca__mapping {
  size_t offset, size;
  gca_memhandle_t handle;
} gca__mapping_t;

/* A segment: one device allocation, carved into blocks.
 * Invariant: sum of its blocks' sizes == size; head->addr == base.
 * Expandable segments (Note [Expandable segments]): the blocks tile the
 * reservation [base, base + reserved_size) instead, unmapped blocks included;
 * size == sum of the mapped blocks' sizes == sum of maps[].size; maps is
 * sorted by offset, disjoint, and covers exactly the mapped blocks. */
struct gca__segment {
  gca_devptr_t base;
  size_t size;
  gca_stream_t stream;
  gca__pool_t *pool;
  gca__block_t *head;
  gca__segment_t *prev, *next; /* the pool's segment list */
  bool oversize;               /* counted in oversize_segments at creation */
  bool expandable;             /* an expandable segment (expandable.c) */
  bool suspended;              /* pool.c: memory released by gca_pool_suspend; maps[]
                                  keep their places, reserved counts none of it */
  bool stream_gone;            /* its stream was destroyed (Note [Destroyed streams]) */
  bool gone_waited;            /* and its work was waited for then: a release need not wait */
  size_t reserved_size;        /* expandable: bytes of address space reserved */
  gca__mapping_t *maps;        /* expandable: the mappings, by offset; classic: NULL, or the
                                  one handle of a VMM-backed segment (Note [VMM-backed
                                  classic segments], segment.c) */
  size_t nmaps, cap_maps;
  /* expandable: handles unmapped from free ranges for a growth that asked for
   * them (gca__expand_take_donors), mapped again by it; park_want is how many
   * more bytes it still wants parked; park_hole the address of the unmapped
   * block they were taken for, which the growth maps (it, not a hole the
   * moves opened, whose filling would need more). All zero outside that
   * growth. */
  gca_memhandle_t *parked;
  size_t nparked, park_want;
  gca_devptr_t park_hole;
  struct gca__horizons *hz; /* expandable: its move horizons, NULL until the first (horizon.c) */
};

/* One entry of a release batch (Note [No waits under the device lock]): the
 * releasing block b of seg, [lo, hi) its offsets in seg at the time it was
 * taken, and the status of the unlocked step. */
typedef struct gca__relent {
  gca__segment_t *seg;
  gca__block_t *b;
  size_t lo, hi;
  gca_status_t st;
  bool expandable; /* seg's kind (a classic seg is freed once finished) */
  bool keep;       /* expandable: the segment stays even when nothing stays mapped */
  bool safe;       /* expandable: no wait: no queued work uses it, or `lend` */
  bool lend;       /* expandable: lent to a growth of its own segment (Note [Lent granules]) */
  uint64_t hz;     /* expandable: waited, stamps below it are covered once the wait is done;
                      lent, the stamp of its range (Note [Move horizons]) */
} gca__relent_t;

/* A release batch: taken under the lock, waited for and freed without it,
 * finished under it. `bytes` counts the mapped bytes of its blocks. */
typedef struct gca__relbatch {
  gca__relent_t *v;
  size_t n, cap, bytes;
  bool captures;       /* the device had capture routes when the lock was let go */
  gca_stream_t waited; /* a retired stream already waited for (Note [Destroyed streams]);
                          its segments skip the wait */
} gca__relbatch_t;

/* A pool: segments and the free tree over their free blocks. The default
 * pools of a device are small (requests <= 1 MiB, 2 MiB segments) and large.
 * Invariant: the free structure (Note [Free bins], freetree.c: per-stream
 * bins, and the overflow treap `root` for streams without bins) holds exactly
 * the free blocks of the pool's segments (nfree of them); each of its treaps
 * is ordered by (stream, size, addr) and heap-ordered by prio. */
struct gca__pool {
  gca__devalloc_t *dev;
  gca__block_t *root;      /* the overflow treap */
  struct gca__fbins *bins; /* NULL until a stream's blocks first need bins */
  size_t nfree;
  gca__segment_t *segments;
  size_t nsegments;
  uint64_t free_calls; /* get_free_block calls while GC is on (block ages), and the move
                          horizons of its expandable segments (Note [Move horizons]) */
  uint64_t gen;        /* bumped by every change of the free tree (Note [Exact hits]) */
  uint64_t id[2];      /* {0,0} for the default pools */
  bool is_small;
  bool no_split;         /* never split a block (private pools created with no_split) */
  gca__mempool_t *owner; /* the private pool holding this tree, NULL for the default pools */
};

/* A device's pointer -> block map of its allocated blocks: a slot holds
 * the address, its block and what a free into a recycle bin needs to know of
 * it side by side (Note [Free facts], recycle.c), so a lookup of a map too
 * large for the caches misses once, not once for the key, again for the value
 * and again for the block. Invariant: count == allocated blocks of the
 * device; count * 2 <= cap. */
typedef struct gca__ptrslot {
  _Alignas(32) gca_devptr_t key; /* 0 = empty slot */
  struct gca__block *val;
  gca_stream_t stream; /* val's stream while facts hold */
  uint32_t facts;      /* GCA__PF_*, 0 = none (recycle.h) */
  uint32_t epoch;      /* the facts hold while == the device's pf_epoch */
} gca__ptrslot_t;
typedef struct gca__ptrmap {
  gca__ptrslot_t *slots;
  uint32_t cap, count;
} gca__ptrmap_t;

/* A freed block waiting for an event recorded on a stream that used it; the
 * event belongs to the stream's device `dev`. */
typedef struct gca__pending {
  gca_event_t event;
  gca_stream_t stream;
  gca__block_t *block;
  int dev;
} gca__pending_t;

/* The events of one device that an allocator created, pooled for reuse: n
 * in the pool, `out` recorded for pending frees (Note [Stream-ordered reuse]). */
typedef struct gca__evpool {
  gca_event_t *ev;
  size_t n, cap, out;
} gca__evpool_t;

/* The pending-free part of a type's active statistic (Note [Active
 * statistics]): current, the peak of allocation + current while it was
 * nonzero, and its value at the last reset of accumulated statistics. */
typedef struct gca__pend_stat {
  int64_t current, peak, base;
} gca__pend_stat_t;

/* The free cache's slots: the one cached block of the (stream, default
 * pool)s that hash to each (Note [Free cache]). */
#define GCA__FC_SLOTS 64 /* per device: 32 stream hashes x the two default pools */

/* The nine per-pool statistic arrays of gca_stats_t, as one index space
 * (array * GCA_STAT_TYPES + type): what thread caches hold headroom for. */
#define GCA__TC_NSTATS (9 * GCA_STAT_TYPES)

/* Bits of d->tc_gate: the thread caches are off (or not engaged yet); the
 * device is not quiet (gca__fc_quiet: frees wait for events or a capture, a
 * request may be routed to a private pool, a history recorder is on; Note
 * [Leaf gate]). */
#define GCA__TC_GATE_OFF  1u
#define GCA__TC_GATE_BUSY 2u

/* The allocator of one device. Everything below `lock` is guarded by it. */
struct gca__devalloc {
  gca__mutex_t lock;
  int device;
  uint64_t inst; /* this allocator's number, one per creation in the process: what a thread
                    parked on it names (Note [Thread cache waste]) */
  const gca_device_ops_t *ops;
  gca_alloc_config_t cfg; /* copy of the process settings, refreshed by gca_set_config */
  bool has_divisions;     /* some roundup_power2_divisions entry is > 1 */
  bool caching;
  gca__pool_t small, large;
  gca__ptrmap_t ptrs; /* allocated blocks by address */
  gca_stats_t stats;  /* active and active_bytes stay zero: see pend */
  gca__pend_stat_t pend[GCA_STAT_TYPES], pend_bytes[GCA_STAT_TYPES]; /* Note [Active statistics] */
  size_t total_memory;    /* device total (mem_get_info at creation) */
  size_t reserved;        /* bytes of all segments */
  size_t reserving;       /* bytes of segments being created with the lock released
                             (release_lock_on_cudamalloc), held against the limit */
  size_t releasing;       /* bytes of release batches under way (still in reserved) */
  unsigned nreleases;     /* release batches under way */
  uint64_t release_gen;   /* release batches finished; written under lock and rel_mu */
  pthread_mutex_t rel_mu; /* with rel_cv: waiting for a release batch, no device lock held */
  pthread_cond_t rel_cv;
  bool set_fraction;       /* a fraction or limit is in force */
  size_t allowed_max;      /* cap on reserved when set_fraction */
  gca__pending_t *pending; /* Note [Stream-ordered reuse] */
  size_t npending, cap_pending;
  gca__evpool_t events[GCA__MAX_DEVICES]; /* by the device of the stream recorded on */
  gca__block_t *block_free;               /* slab free list (linked through ->next) */
  struct gca__slab *slabs;                /* slab.c: every slab, for teardown */
  size_t nslabs, cap_slabs;
  size_t live_blocks;          /* block structs in use */
  size_t granularity;          /* expandable segments: mem_granularity, queried on first use */
  int peers[GCA__MAX_DEVICES]; /* devices given access to this device's expandable memory */
  int npeers;
  /* Private pools (pool.c). routing == nroutes + thread scopes naming this
   * device, read with one relaxed load on the hot path (0: no routing). */
  gca__mempool_t *mempools; /* live and dying private pools */
  gca__route_t *routes;
  size_t nroutes, cap_routes;
  atomic_uint routing;
  /* Note [Thread caches] (tcache.c): 0 while the thread caches' fast paths may
   * run; read by them without the lock, written under it (GCA__TC_GATE_*). */
  atomic_uint tc_gate;
  int deferred_need;   /* 1 + a device a deferred free waits for (a destroyed stream's
                          use): the reap waits for it (Note [Gone streams of deferred frees]) */
  int deferred_waited; /* 1 + the device just waited for, while the reap flushes again */
  unsigned ncaptures;  /* capture routes; while > 0 no event is queried */
  int64_t nused;       /* blocks with recorded uses (gca__uses_set): retirements walk if any */
  bool gone_dirty;     /* freed into a destroyed stream's segment since the last reclaim */
  bool keep_partial;   /* a refused growth keeps its start (Note [Moves on out of memory]) */
  int64_t live_hwm, peak_stale; /* the live peak for Note [Moves within a bound] */
  gca__block_t **deferred;      /* Note [Frees during capture] */
  size_t ndeferred, cap_deferred;
  /* Note [Free cache]: fc_on says frees may be cached now (free_cache key,
   * caching on, no garbage collection); fc_count blocks are cached, in
   * fc_slots; fc_waste: puts evicted unused, less what hits paid back; once
   * it is off, fc_skips more frees are not cached before the next probe
   * (Note [Free cache waste]). */
  bool fc_on;
  uint8_t fc_waste, fc_skips;
  /* Note [Leaf gate] (fcache.h): GCA__GATE_FC clear while the free cache's
   * leaf hits may run, GCA__GATE_RB while the recycle bins' may; brought up
   * to date under the lock by every holder as it lets it go. */
  uint8_t fc_gate;
  size_t fc_count;
  /* Note [Lazy puts]: the free cache's last plain put (of a block in `slot`),
   * whose statistics are owed until the next take of that block cancels them
   * or anything else settles them (gca__fc_settle); b NULL: no put owed.
   * pairs: the cancelled put-and-take pairs of that block not yet counted,
   * req_in and req_out the requested bytes they took and put. hot: the block
   * the last cancel made active, when no put came since, whose free may put
   * it back with the record as it is (gca__fc_reput). */
  struct {
    gca__block_t *b, *hot;
    gca__block_t **slot;
    int t;
    bool oversize;
    int64_t size, requested, blocks, bytes;
    int64_t pairs, req_in, req_out;
    /* (b->size - 1) >> 9 when b is in the default pool of its size, else
     * SIZE_MAX: the one test of size and pool a leaf take makes (Note [Leaf
     * hits]), gca__round_key of the request */
    size_t leaf_key;
  } fc_lazy;
  /* Something waits to be given back at the end of the entry point that holds
   * the lock (gca__dev_unlock -> gca__release_reap): a dying idle private pool,
   * or with caching off a segment whose blocks are all free. Set deep in a
   * free, where the lock cannot be let go (Note [No waits under the device lock]). */
  bool reap;
  gca__block_t *fc_slots[GCA__FC_SLOTS];
  struct gca__rbins *rb; /* Note [Recycle bins]: NULL until the first put */
  size_t rb_count;       /* blocks in them */
  /* Note [Owed bin statistics] (recycle.h): the bins' leaf takes (t*) and
   * puts (p*) since the last settle, in blocks, bytes and requested bytes,
   * all of the small pool; and the rises each quantity may take above
   * d->stats before a peak could pass, read when the first was owed (on). */
  struct {
    bool on;
    int64_t tn, tb, tr, pn, pb, pr;
    int64_t room_n, room_b, room_r, room_sn, room_sb;
  } rb_owe;
  uint32_t pf_epoch; /* Note [Free facts]: bumped by any change of the caches' settings */
  uint64_t epoch;    /* Note [Free cache epochs] */
  /* Note [Thread caches]: the thread caches of this device (their list and
   * count), whether frees may enter them (tc_on), the first thread seen and
   * whether a second one has been (they engage then), and tc_esc[i], the sum
   * of their headroom for statistic i (gca__stat_index). */
  gca__tcache_t *tcs;
  size_t ntcs;
  size_t tc_held; /* blocks in their domains, all caches: with none, no free or
                     split needs to look for one beside it */
  bool tc_on;
  bool tc_count; /* tc_on and tcs exist: the statistics count the caches' deltas and
                    headroom; else both are zero (gca__tc_update folds and takes back) */
  bool tc_engaged;
  uint64_t tc_thread;
  int64_t tc_esc[GCA__TC_NSTATS];
};

/* Takes d->lock for anything but the free cache's fast paths, which use
 * gca__mutex_trylock (Note [Free cache epochs]). */
/* fcache.c: applies the statistics the free cache's last put owes (Note
 * [Lazy puts]); d->lock held. */
void gca__fc_settle(gca__devalloc_t *d);
/* Before anything but the free cache's fast paths reads or changes d's
 * statistics (Note [Lazy puts]). */
static inline void gca__fc_settled(gca__devalloc_t *d) {
  if (GCA_UNLIKELY(d->fc_lazy.b != NULL || d->fc_lazy.pairs != 0 || d->rb_owe.on))
    gca__fc_settle(d);
}

static inline void gca__dev_lock(gca__devalloc_t *d) {
  gca__mutex_lock(&d->lock);
  d->epoch++;
  gca__fc_settled(d);
}

/* Whether the free cache's fast paths may run on device d now (d->lock held):
 * nothing is pending, no request is routed to a private pool and no history
 * is recorded, so a hit or a put is the whole operation. */
static inline bool gca__fc_quiet(const gca__devalloc_t *d) {
  return (d->npending | d->ndeferred | atomic_load_explicit(&d->routing, memory_order_relaxed) |
          atomic_load_explicit(&gca__history_recorders, memory_order_relaxed)) == 0;
}

/* Note [Thread caches]: the gate the thread caches' fast paths read without
 * the lock, brought up to date by each entry point as it lets the lock go. */
static inline void gca__tc_gate_sync(gca__devalloc_t *d, bool quiet) {
  unsigned g = (d->tc_on ? 0u : GCA__TC_GATE_OFF) | (quiet ? 0u : GCA__TC_GATE_BUSY);
  if (GCA_UNLIKELY(g != atomic_load_explicit(&d->tc_gate, memory_order_relaxed)))
    atomic_store_explicit(&d->tc_gate, g, memory_order_relaxed);
}

/* Note [Leaf gate] (fcache.h): whether anything the free cache's leaf hits
 * (bit GCA__GATE_FC) or the recycle bins' (GCA__GATE_RB) cannot handle is
 * under way, computed as a holder lets d->lock go. */
#define GCA__GATE_FC 1u
#define GCA__GATE_RB 2u
static inline void gca__fc_gate_sync(gca__devalloc_t *d, bool quiet) {
  bool both = d->reap | d->has_divisions | !d->fc_on | (d->ncaptures != 0) | !quiet;
  /* the bins' leaves count the thread caches' headroom and ask the calling
   * thread's parked cache; the free cache's assume there is none */
  bool tcs = (d->tcs != NULL) | d->tc_on;
  d->fc_gate = (uint8_t)((both | tcs | (d->fc_waste != 0)) * GCA__GATE_FC |
                         (both | !d->cfg.recycle_bins) * GCA__GATE_RB);
}
/* fcache.c: takes and lets go every device's lock, so that their gates
 * say a history recorder is on (history.c calls it after turning one on,
 * with none of its own locks held). */
void gca__fc_gates_shut(void);

/* Lets d->lock go, the leaf gate first: every holder that does not end an
 * entry point with gca__dev_unlock lets go with this. */
static inline void gca__dev_let_go(gca__devalloc_t *d) {
  bool quiet = gca__fc_quiet(d);
  gca__fc_gate_sync(d, quiet);
  if (d->tcs != NULL) /* without thread caches no fast path reads it */
    gca__tc_gate_sync(d, quiet);
  gca__mutex_unlock(&d->lock);
}

void gca__release_reap(gca__devalloc_t *d); /* release.c, below */
/* Waits, d->lock held but let go meanwhile, until no release batch is under way. */
void gca__release_wait_all(gca__devalloc_t *d);
/* Lets d->lock go at the end of an entry point (allocator.c, pool.c,
 * checkpoint.c: nothing of d is held in locals), first giving back what frees
 * left to give back (d->reap), with the lock let go around the waits. */
static inline void gca__dev_unlock(gca__devalloc_t *d) {
  if (GCA_UNLIKELY(d->reap))
    gca__release_reap(d);
  gca__dev_let_go(d);
}

#include "alloc_stats.h"

/* ---- small facts shared by the floors (inline) ---- */

/* A block alone in its segment. */
static inline bool gca__block_whole(const gca__block_t *b) {
  return b->prev == NULL && b->next == NULL;
}

/* What b, not free, adds to (inactive_split, _bytes) as a free run of its
 * own, never merged while it waits (a binned block, Note [Recycle bins]; a
 * thread cache's with the bins on, Note [Thread cache runs]): one block of
 * its size, unless it is its segment's only block. */
static inline void gca__run_alone(const gca__block_t *b, int64_t *blocks, int64_t *bytes) {
  bool whole = gca__block_whole(b);
  *blocks = whole ? 0 : 1;
  *bytes = whole ? 0 : (int64_t)b->size;
}

/* Garbage collection is on: a limit is set and a threshold given. */
static inline bool gca__gc_enabled(const gca__devalloc_t *d) {
  return d->set_fraction && d->cfg.garbage_collection_threshold > 0.0;
}

/* Adds seg at the head of pool's segment list. */
static inline void gca__segment_link(gca__pool_t *pool, gca__segment_t *seg) {
  seg->prev = NULL;
  seg->next = pool->segments;
  if (pool->segments != NULL)
    pool->segments->prev = seg;
  pool->segments = seg;
  pool->nsegments++;
}

/* Takes seg out of pool's segment list. */
static inline void gca__segment_unlink(gca__pool_t *pool, gca__segment_t *seg) {
  if (seg->prev != NULL)
    seg->prev->next = seg->next;
  else
    pool->segments = seg->next;
  if (seg->next != NULL)
    seg->next->prev = seg->prev;
  pool->nsegments--;
}

/* Whether b is held by a cache whose statistics count it merged with its
 * free neighbours: freed into the free cache, or in a thread cache's domain,
 * cached there or handed out, unless it counts as a run of its own there
 * (Note [Thread caches], Note [Thread cache runs]). */
static inline bool gca__held(const gca__block_t *b) {
  return b->cached || (b->tc != NULL && !b->tc_apart);
}

/* The held block sharing a free run with b on b's lower (upper) side: the
 * neighbour itself, or the block past a free neighbour; NULL when none
 * (Note [Free cache]: a cached block's run holds no other held block). */
static inline gca__block_t *gca__fc_cached_below(const gca__block_t *b) {
  gca__block_t *p = b->prev;
  if (p == NULL)
    return NULL;
  if (gca__held(p))
    return p;
  return p->in_tree && p->prev != NULL && gca__held(p->prev) ? p->prev : NULL;
}
static inline gca__block_t *gca__fc_cached_above(const gca__block_t *b) {
  gca__block_t *n = b->next;
  if (n == NULL)
    return NULL;
  if (gca__held(n))
    return n;
  return n->in_tree && n->next != NULL && gca__held(n->next) ? n->next : NULL;
}

/* Whether a held block shares a free run with b's neighbours. */
static inline bool gca__fc_near(const gca__block_t *b) {
  return gca__fc_cached_below(b) != NULL || gca__fc_cached_above(b) != NULL;
}

/* ---- streamkey.c (Note [Per-thread stream keys]) ---- */

/* The calling thread's key for GCA_STREAM_PER_THREAD, NULL until first use. */
extern _Thread_local gca_stream_t gca__t_ptds_key __attribute__((tls_model("initial-exec")));
gca_stream_t gca__ptds_key_slow(void);
/* The allocator's key for a stream handle: the handle itself, NULL for
 * GCA_STREAM_LEGACY, the calling thread's own key for GCA_STREAM_PER_THREAD.
 * Inline: one compare on the hot path. */
/* The key of s when it needs no call (not the first per-thread request of a
 * thread), else GCA_STREAM_PER_THREAD itself: a path that must call
 * nothing takes its slow side then. */
static inline gca_stream_t gca__stream_key_nocall(gca_stream_t s) {
  if (GCA_LIKELY((uintptr_t)s > 2))
    return s;
  if (s != GCA_STREAM_PER_THREAD)
    return NULL;
  return gca__t_ptds_key != NULL ? gca__t_ptds_key : s;
}
/* Whether key, a block's stream key, is the key of handle s, calling
 * nothing: the handle itself first (no key is 1 or 2, and NULL is the key of
 * NULL and of GCA_STREAM_LEGACY alike), then its key. For the leaves. */
static inline bool gca__stream_keyed(gca_stream_t key, gca_stream_t s) {
  return GCA_LIKELY(key == s) || key == gca__stream_key_nocall(s);
}
static inline gca_stream_t gca__stream_key(gca_stream_t s) {
  if (GCA_LIKELY((uintptr_t)s > 2))
    return s;
  if (s != GCA_STREAM_PER_THREAD)
    return NULL;
  return gca__t_ptds_key != NULL ? gca__t_ptds_key : gca__ptds_key_slow();
}
/* Per-thread keys are GCA__PTDS_TAG | a serial number: a non-canonical
 * address, which neither a driver's handle (a user-space pointer) nor a sim
 * handle (a kind in the top byte) has. */
#define GCA__PTDS_TAG ((uintptr_t)0xfffe000000000000ull)
/* A key no thread is given (serials start at 1): a recorded use of a stream
 * that was destroyed becomes this, a wait for the whole device (Note
 * [Destroyed streams], streamkey.c). */
#define GCA__STREAM_GONE ((gca_stream_t)GCA__PTDS_TAG)
/* Whether key s is a per-thread key (some thread's, or GCA__STREAM_GONE). */
static inline bool gca__stream_is_ptds(gca_stream_t s) {
  return ((uintptr_t)s >> 48) == (GCA__PTDS_TAG >> 48);
}
/* stream_synchronize for key s of d's device; another thread's per-thread
 * key waits for the whole device (GCA_ERR_NOT_READY, no detail, while a
 * capture runs). Lock rules: those of the stream wait it replaces. */
gca_status_t gca__stream_synchronize(gca__devalloc_t *d, gca_stream_t s);
/* event_record of ev (an event of device dev) on key s of device dev, or
 * stream_synchronize of it when ev is NULL; the calling thread's per-thread
 * key runs with dev current; another thread's waits for the device (and
 * records on dev's legacy stream). */
gca_status_t gca__stream_op(gca__devalloc_t *d, int dev, gca_stream_t s, gca_event_t ev);

/* ---- sizes.c ---- */

/* PyTorch's round_size: 512-byte minimum and multiple, or the next
 * roundup_power2_divisions step when one applies. size <= GCA__MAX_REQUEST. */
size_t gca__alloc_round_size(const gca_alloc_config_t *cfg, size_t size);
/* The rounding without roundup_power2_divisions: 512-byte minimum and
 * multiple. */
static inline size_t gca__round_plain(size_t size) {
  return size < GCA__MIN_BLOCK_SIZE ? GCA__MIN_BLOCK_SIZE
                                    : (size + GCA__MIN_BLOCK_SIZE - 1) & ~(GCA__MIN_BLOCK_SIZE - 1);
}
/* (size - 1) >> 9 (size >= 1): equal for two sizes exactly when their
 * gca__round_plain are, in two instructions instead of a rounding. */
static inline size_t gca__round_key(size_t size) {
  _Static_assert(GCA__MIN_BLOCK_SIZE == 512, "gca__round_key shifts by 9");
  return (size - 1) >> 9;
}
/* The same with d's settings; inline for the entry points. */
static inline size_t gca__round_request(const gca__devalloc_t *d, size_t size) {
  if (GCA_UNLIKELY(d->has_divisions))
    return gca__alloc_round_size(&d->cfg, size);
  return gca__round_plain(size);
}
/* Segment size for a rounded request: 2 MiB (small), 20 MiB (< 10 MiB), else
 * rounded up to 2 MiB. */
size_t gca__alloc_segment_size(size_t rounded);
/* A no_split pool's segment holds exactly one block: sized to fit. */
size_t gca__alloc_no_split_segment_size(size_t rounded);
/* Whether a free block of block_size serving `rounded` leaves a remainder block. */
bool gca__alloc_should_split(const gca_alloc_config_t *cfg, bool small_pool, size_t block_size,
                             size_t rounded);
/* Whether a free block of block_size may serve `rounded` (max_split_size rules). */
bool gca__alloc_block_fits(const gca_alloc_config_t *cfg, size_t block_size, size_t rounded);
/* GCA_ERR_OUT_OF_MEMORY naming `what` ("a segment", "a mapping") when
 * reserving `bytes` more would pass d's memory limit (bytes being reserved by
 * other threads count); the one memory-limit check. */
gca_status_t gca__limit_check(const gca__devalloc_t *d, size_t bytes, const char *what);

/* ---- slab.c ---- */

/* Zeroed host memory for a large table of the allocator's own (block
 * records, the pointer map), on transparent huge pages where it spans any
 * (Note [Records on huge pages]); NULL when the host has none. Given back
 * with gca__table_free and the same size. */
void *gca__table_alloc(size_t bytes);
void gca__table_free(void *p, size_t bytes);

/* Grows the slabs by one (GCA_ERR_OUT_OF_MEMORY with the detail set when the
 * host has no memory left). */
gca_status_t gca__block_reserve_slow(gca__devalloc_t *d);
/* Makes sure one block record is available, so that later steps cannot fail. */
static inline gca_status_t gca__block_reserve(gca__devalloc_t *d) {
  if (GCA_LIKELY(d->block_free != NULL))
    return GCA_OK;
  return gca__block_reserve_slow(d);
}
/* Takes a record reserved by gca__block_reserve, cleared. */
static inline gca__block_t *gca__block_take(gca__devalloc_t *d) {
  gca__block_t *b = d->block_free;
  GCA_ASSERT(b != NULL);
  d->block_free = b->next;
  /* field by field: a memset of the whole struct costs more than the rest of a pair */
  b->requested = 0;
  b->prev = b->next = b->left = b->right = NULL;
  b->gc_base = 0;
  b->uses = NULL;
  b->nuses = b->cap_uses = 0;
  b->event_count = 0;
  b->allocated = b->in_tree = b->oversize = b->unmapped = b->cached = b->releasing = false;
  b->binned = false;
  b->fc_epoch = 0;
  b->fc_exact = 0;
  b->tc = NULL;
  d->live_blocks++;
  return b;
}
/* Note [Record lines]: at 10^6 blocks nearly every record a free touches is
 * a cache miss, so what the merge touches of a free neighbour lies in the
 * record's first line: its key and tree links, its address neighbours (the
 * merge unlinks it) and its state. Its stream is not read (a segment's
 * blocks share one, so the caller passes its own, gca__tree_erase_of), and
 * neither is its uses array: a free block has none, since the block entering
 * the free tree drops its array (gca__block_coalesce), and the merged record
 * goes back unchecked (gca__block_free_merged). The walker checks that no
 * block of the tree holds one. The second line holds what a free or an
 * allocation of the block itself reads: its stream, pool, requested size,
 * thread cache and the count of its uses (the array itself, and the free
 * cache's facts, lie in the third). */

/* Frees b's uses array (Note [Record lines]). */
void gca__block_drop_uses(gca__devalloc_t *d, gca__block_t *b);
/* Sets b's count of recorded uses, keeping d->nused. */
static inline void gca__uses_set(gca__devalloc_t *d, gca__block_t *b, uint32_t n) {
  d->nused += (int64_t)(n != 0) - (int64_t)(b->nuses != 0);
  b->nuses = n;
}

/* Gives back the record of a free block merged into its neighbour: it holds
 * no uses array (Note [Record lines]). */
static inline void gca__block_free_merged(gca__devalloc_t *d, gca__block_t *b) {
  GCA_ASSERT_DEBUG(b->uses == NULL);
  b->next = d->block_free;
  d->block_free = b;
  d->live_blocks--;
}

/* gca__block_reserve then gca__block_take. */
gca_status_t gca__block_new(gca__devalloc_t *d, gca__block_t **out);
/* Gives a record back (and its uses array). */
void gca__block_free(gca__devalloc_t *d, gca__block_t *b);
/* Frees every slab (allocator teardown). */
void gca__slabs_destroy(gca__devalloc_t *d);

/* ---- segment.c ---- */

/* Gets a new segment for `rounded` bytes: a classic one of `size` bytes whose
 * single block is returned free and outside the tree, or with expandable
 * segments the (pool, stream) expandable segment grown by at least `size`
 * (gca__expand_alloc). `retry` counts a num_alloc_retries. The lock may be let
 * go around the driver call (release_lock_on_cudamalloc).
 * GCA_ERR_OUT_OF_MEMORY when the driver or the memory limit refuses. */
gca_status_t gca__segment_alloc(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                size_t size, size_t rounded, bool retry, gca__block_t **out);
/* The free bytes of d's segments that no release can give back while the
 * blocks in use beside them stay: all free bytes of a classic segment that
 * holds a block in use, and in an expandable segment those of a free block
 * outside the whole mappings inside it (granules shared with a block in
 * use). Free: in the tree, cached or binned (a thread cache's block counts
 * as in use; a block a release batch is giving back, as neither). For the
 * out-of-memory message, which holds the device lock while it walks the
 * blocks: false, nothing walked, when d has more than GCA__STUCK_WALK_MAX
 * block records (at 10^6 blocks the walk took 100 ms). */
#define GCA__STUCK_WALK_MAX 16384
bool gca__segments_stuck_bytes(gca__devalloc_t *d, size_t *out);
/* Waits for seg's stream, or its device when the stream is gone (Note [Destroyed streams]). */
gca_status_t gca__segment_stream_sync(gca__devalloc_t *d, const gca__segment_t *seg);
/* Returns a classic segment's memory to the driver whatever its blocks:
 * mem_free, or for a VMM-backed one (Note [VMM-backed classic segments])
 * unmap (after its stream is done when `sync`), release and unreserve; once
 * unmapped the memory is gone, so later failures are only logged. The caller
 * keeps the record and its owner entry. */
gca_status_t gca__segment_memory_free(gca__devalloc_t *d, gca__segment_t *seg, bool sync);
/* Tells the segment observer of pool's private pool, if any, of [base, +
 * bytes) (Note [Segment observers], pool.h). A CREATED or MAPPED failure is
 * returned with the observer's detail, prefixed; the others are logged and
 * GCA_OK is returned. */
gca_status_t gca__observe(gca__pool_t *pool, gca_segment_event_t ev, gca_devptr_t base,
                          size_t bytes);
/* Release batches (Note [No waits under the device lock]); release.c runs them.
 * Takes seg's releasable memory out of reach into bt: a classic segment whose
 * single block is in the tree, or an expandable segment's free blocks that
 * hold whole mappings; they leave the tree, marked releasing. Only host
 * memory can fail (nothing taken then). */
gca_status_t gca__relbatch_take(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg);
/* Room for `more` entries in bt (GCA_ERR_OUT_OF_MEMORY, detail set). */
gca_status_t gca__relbatch_room(gca__relbatch_t *bt, size_t more);
/* Takes free block b of seg (in the tree, room made) into bt, counting `bytes`. */
void gca__relbatch_add(gca__relbatch_t *bt, gca__segment_t *seg, gca__block_t *b, size_t bytes);
/* The unlocked step, with NO lock held: waits for the streams of bt's
 * segments (the device, once, when a stream is gone) and frees classic
 * segments' memory; the statuses go to the entries. */
void gca__relbatch_wait(gca__devalloc_t *d, gca__relbatch_t *bt);
/* Finishes a classic entry under the lock: its memory freed, the segment
 * leaves the pool with its accounting and history; else its block goes back
 * to the tree and the status (prefixed) is returned. */
gca_status_t gca__relbatch_finish_classic(gca__devalloc_t *d, gca__relent_t *e, size_t *released);
/* Frees the host records of a VMM-backed classic segment after its memory was
 * given back in the unlocked step. */
void gca__segment_maps_forget(gca__segment_t *seg);
/* Gives a segment of either kind back whatever its blocks, with its owner
 * entry and its blocks' uses, and frees the record (teardown: the caller
 * drops the whole list; failures are logged). */
void gca__segment_destroy(gca__devalloc_t *d, gca__segment_t *seg);

/* ---- blocks.c ---- */

/* Merges b (free, outside the tree) with its free neighbours and puts the
 * result in the tree, taking a neighbour's tree place where it can (Note
 * [Tree places]). Returns the change in inactive_split through the pointers;
 * statistics are the caller's. */
void gca__block_coalesce(gca__devalloc_t *d, gca__block_t *b, int64_t *blocks, int64_t *bytes);
/* Puts a block whose last use has completed into the free tree, merging it
 * with free neighbours (PyTorch's free_block); `pending`: it was
 * pending-free. No cached block may be near b (gca__fcache_evict_near first).
 * Releases the segment when caching is off and tells a private pool. */
void gca__block_free_complete(gca__devalloc_t *d, gca__block_t *b, bool pending);
/* Best fit for (stream, rounded) in pool (PyTorch's get_free_block), or NULL;
 * the block stays in the tree (Note [Tree places]). The free cache holds
 * nothing near the pool's blocks (flushed, or a private pool). */
gca__block_t *gca__pool_take_fit(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                 size_t rounded);
/* Makes a free block active for a request, splitting off the remainder when
 * the rules say so (PyTorch's alloc_found_block). A block record must have
 * been reserved. */
void gca__block_activate(gca__devalloc_t *d, gca__block_t *b, size_t rounded, size_t requested);

/* ---- fcache.c: see fcache.h ---- */
/* ---- pending.c ---- */

/* The free request of live block b (out of the pointer map): with uses on
 * other streams its events are recorded and it becomes pending (during a
 * capture: deferred), else its free completes now. On failure nothing
 * changed. A use whose stream is gone (GCA_ERR_INVALID_HANDLE) fails with
 * *gone_dev its device, unless that is *gone_dev on entry (waited for: the use
 * is dropped); else *gone_dev is -1. _deferred: that device cannot be waited
 * for now (a capture runs): b is deferred, the reap waits (Note [Gone streams
 * of deferred frees]). */
gca_status_t gca__free_request(gca__devalloc_t *d, gca__block_t *b, int *gone_dev);
gca_status_t gca__free_request_deferred(gca__devalloc_t *d, gca__block_t *b, int gone);
/* Waits, with NO lock held, for use u's stream (caching off's free). */
gca_status_t gca__use_wait(gca__devalloc_t *d, const gca__use_t *u);
/* Completes the pending frees whose events are done, without blocking
 * (nothing while a capture is under way). */
gca_status_t gca__pending_process(gca__devalloc_t *d);
/* Waits for every pending free of the device (PyTorch's
 * synchronize_and_free_events), counted in num_sync_all_streams: the events
 * are waited for with d->lock let go, then completed by queries (Note [No
 * waits under the device lock]); on return the lock is held again. */
gca_status_t gca__pending_sync(gca__devalloc_t *d);
/* Records the events of the frees deferred during capture; those that fail
 * stay deferred. Call once no capture is under way on the device. */
gca_status_t gca__pending_flush_deferred(gca__devalloc_t *d);
/* Makes room to park n more blocks with gca__pending_park, so that parking
 * cannot fail (GCA_ERR_OUT_OF_MEMORY, detail set). */
gca_status_t gca__pending_park_reserve(gca__devalloc_t *d, size_t n);
/* Parks free block b (out of the tree, not pending, its uses set) as a
 * deferred free (Note [Frees during capture]): its events are recorded by the
 * next gca__pending_flush_deferred or gca__pending_process with no capture
 * under way, and it joins the tree once they have completed. Counts it
 * pending (Note [Active statistics]); the caller keeps its owner's nactive.
 * For a restore (Note [Checkpoints and stream uses], checkpoint.c). */
void gca__pending_park(gca__devalloc_t *d, gca__block_t *b);
/* Synchronizes and destroys every event (allocator teardown). */
void gca__pending_destroy(gca__devalloc_t *d);

/* ---- release.c ---- */

/* PyTorch's release_cached_blocks: flushes the free cache and the thread
 * caches' cached blocks, waits for pending frees, then frees every cached
 * whole segment. Lets d->lock go around the
 * waits (Note [No waits under the device lock]). */
gca_status_t gca__release_cached(gca__devalloc_t *d);
/* A new block for `rounded` bytes when no cached block fits: garbage
 * collection when on, a new segment of seg_size, then the out-of-memory
 * remedies in PyTorch's order, each followed by a retry; last, a use_on_oom
 * private pool's cached block (then b->pool is that pool's). Segment calls run
 * in relaxed capture mode while a capture is under way. The block is free,
 * in its tree or not. GCA_ERR_OUT_OF_MEMORY when everything failed. */
gca_status_t gca__release_new_block(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                    size_t seg_size, size_t rounded, gca__block_t **out);
/* Runs release batch bt taken under d->lock: lets the lock go for the waits
 * and the driver frees, retakes it and finishes; bt is emptied. Returns with
 * the lock held and the first failure. For entry points only. */
gca_status_t gca__relbatch_run(gca__devalloc_t *d, gca__relbatch_t *bt, size_t *released);
/* With d->lock held at the end of an entry point: destroys the dying idle
 * private pools and, with caching off, gives back every segment whose blocks
 * are all free, each through a release batch (the lock let go around the
 * waits); clears d->reap. Failures are logged: what failed stays, cached. */
void gca__release_reap(gca__devalloc_t *d);

/* ---- allocator.c ---- */
gca__devalloc_t *gca__devalloc_peek(int device); /* NULL: not created */
/* streamkey.c, Note [Destroyed streams]: retire a stream before its destroy;
 * give back destroyed streams' free segments (lock held, no capture routed) */
void gca__streams_retire(gca_stream_t s);
void gca__streams_reclaim(gca__devalloc_t *d);
/* The allocator of `device`, created on first use; `op` names the caller in
 * the error of a device out of range. */
gca_status_t gca__devalloc_get(const char *op, int device, gca__devalloc_t **out);
/* ---- stats.c ---- */
/* The statistics as readers see them: ALL.allocated/freed summed (Note
 * [Statistics]) and active derived (Note [Active statistics]). The caller
 * holds d->lock. */
void gca__stats_read(const gca__devalloc_t *d, gca_stats_t *out);
/* Finds the live block at addr (a cached or binned block is not live) and
 * returns with its device's lock held, or NULL with no lock held. One device:
 * one map to look in; else the owner map names the device. Else the error of
 * `op` on addr says why (gca__bad_pointer, which takes each device's lock). */
gca__block_t *gca__lock_live(gca_devptr_t addr, gca__devalloc_t **out);
gca_status_t gca__bad_pointer(const char *op, gca_devptr_t addr);
/* uses.c: the waits of a free of live block *bp at addr (lock held) for uses
 * no event follows (another thread's per-thread stream; all, caching off);
 * returns as gca__lock_live, *bp the block again, or a status and no lock. */
gca_status_t gca__free_wait_uses(gca__devalloc_t **dp, gca__block_t **bp, gca_devptr_t addr);

/* ---- check.c ---- */

/* Validates one device allocator; the caller holds d->lock. */
gca_status_t gca__devalloc_check_locked(gca__devalloc_t *d);

/* ---- pool.c ---- */

/* A mapping released by gca_pool_suspend (mempool.c), with its contents when saved. */
struct gca__suspended {
  gca__segment_t *seg;
  size_t map; /* index into seg->maps */
  void *copy;
  gca_memhandle_t handle; /* the mapping's handle, kept here while the pool is busy and written
                             back under the lock (Note [Suspend and resume with the lock let go]) */
};

/* A private pool. Invariants: small.owner == large.owner == this;
 * nactive == allocated + pending-free blocks of its segments;
 * use_count == 0 -> no handle reaches it ("dying"), and it is destroyed
 * (segments released, unlinked) as soon as nactive == 0 and no capture is
 * under way on the device. */
struct gca__mempool {
  gca__devalloc_t *dev;
  uint64_t handle; /* the public handle's value; never reused in the process */
  gca__pool_t small, large;
  int use_count; /* creator, retains, routes and thread scopes */
  size_t nactive;
  bool use_on_oom;
  gca_segment_observer_fn observer; /* Note [Segment observers] (pool.h); fixed at creation */
  void *observer_ctx;
  void (*observer_done)(void *ctx);
  bool destroying;             /* release.c's reap gives its segments back with the lock let go
                                  and holds a use meanwhile: no lookup, route or OOM borrow
                                  reaches it */
  bool suspended;              /* gca_pool_suspend: every segment suspended */
  const char *transition;      /* "suspended" or "resumed" while a suspend or resume works with
                                  the lock let go, else NULL (Note [Suspend and resume with the
                                  lock let go], mempool.c) */
  struct gca__suspended *susp; /* one per mapping released, while suspended */
  size_t nsusp;
  gca__mempool_t *prev, *next; /* the device's list */
};

typedef enum route_kind { ROUTE_FILTER, ROUTE_CAPTURE } route_kind_t;

/* A route (route.c): allocations matching it go to `pool`. Holds one use of
 * the pool. */
struct gca__route {
  gca__mempool_t *pool;
  route_kind_t kind;
  gca_stream_filter_t filter; /* ROUTE_FILTER */
  void *ctx;
  gca_stream_t stream; /* ROUTE_CAPTURE: the stream named at begin */
  uint64_t capture_id; /* ROUTE_CAPTURE: its capture */
};

/* The pools of d in a fixed order: small, large, then each private pool's
 * small and large; NULL after the last. Start with &d->small. Inline: every
 * floor walks the pools. */
static inline gca__pool_t *gca__pool_next(gca__devalloc_t *d, gca__pool_t *p) {
  if (p == &d->small)
    return &d->large;
  gca__mempool_t *m = p->owner;
  if (m != NULL && p == &m->small)
    return &m->large;
  m = m == NULL ? d->mempools : m->next;
  return m != NULL ? &m->small : NULL;
}
/* Checks m's invariants (owner links, nactive) for the walker. */
gca_status_t gca__mempool_check_locked(const gca__devalloc_t *d, const gca__mempool_t *m);
/* Looks a public handle up and returns with its device's lock held; a dead or
 * foreign handle is GCA_ERR_INVALID_HANDLE naming `op` (no lock held then). */
gca_status_t gca__mempool_lookup(const char *op, const void *handle, gca__devalloc_t **d,
                                 gca__mempool_t **m);

/* ---- route.c ---- */

/* *out: the private pool the request on `stream` is routed to, or NULL: the
 * calling thread's innermost scope for d, else the newest matching route.
 * Fails (the driver's status) when a capture route must ask whether `stream`
 * captures and cannot: an unknown answer is not taken for "no". */
gca_status_t gca__route_select_locked(gca__devalloc_t *d, gca_stream_t stream,
                                      gca__mempool_t **out);
/* Adds route *r (one use of its pool); GCA_ERR_OUT_OF_MEMORY naming `op`. */
gca_status_t gca__route_add(const char *op, gca__devalloc_t *d, const gca__route_t *r);
/* Removes route i (order kept: later routes take precedence); the end of the
 * device's last capture records the deferred frees and sweeps dying pools. */
void gca__route_remove(gca__devalloc_t *d, size_t i);
/* Whether a capture route names m. */
bool gca__mempool_capturing_locked(const gca__devalloc_t *d, const gca__mempool_t *m);
/* Opens (closes) a use scope of m on the calling thread; GCA_ERR_INVALID_STATE
 * when too many are nested (m is not the innermost). */
gca_status_t gca__route_scope_push(gca__devalloc_t *d, gca__mempool_t *m);
gca_status_t gca__route_scope_pop(gca__devalloc_t *d, gca__mempool_t *m);

/* ---- mempool.c ---- */

/* A block of `m` became free (completion of a free); a dying pool now idle
 * is left for the reap (d->reap). */
void gca__mempool_block_freed(gca__devalloc_t *d, gca__mempool_t *m);
/* Drops one use of m; a dying, idle pool is left for the reap (d->reap). */
void gca__mempool_unuse(gca__devalloc_t *d, gca__mempool_t *m);
/* Leaves every dying, idle pool for the reap (a capture ended). */
void gca__mempool_sweep_dying(gca__devalloc_t *d);
/* Whether m is dying and idle and may be destroyed now (no capture). */
bool gca__mempool_reapable(const gca__devalloc_t *d, const gca__mempool_t *m);
/* Unlinks and frees m, dying, idle and with no segment left. */
void gca__mempool_forget(gca__devalloc_t *d, gca__mempool_t *m);
/* Releases the memory of every mapping of m's segments (expandable only,
 * else GCA_ERR_NOT_SUPPORTED), saving the contents with
 * GCA_POOL_SUSPEND_SAVE; m keeps its blocks and addresses. On failure m is
 * as it was. The caller checked that m is not suspended and nothing captures.
 * Called and returns with d->lock held, but lets it go for the device work
 * (Note [Suspend and resume with the lock let go], mempool.c). */
gca_status_t gca__mempool_suspend_locked(gca__devalloc_t *d, gca__mempool_t *m, unsigned flags);
/* Maps m's suspended memory again (contents copied back when saved); on
 * failure m stays suspended. Lets the lock go as suspend does. */
gca_status_t gca__mempool_resume_locked(gca__devalloc_t *d, gca__mempool_t *m);
/* GCA_ERR_INVALID_STATE naming `op` while a suspend or resume of m works
 * with the lock let go (m->transition), else GCA_OK. */
gca_status_t gca__mempool_settled(const char *op, const gca__mempool_t *m);
/* Bytes of p's segments (mapped ones), or of its allocated blocks. */
size_t gca__pool_bytes(const gca__pool_t *p, bool allocated_only);
/* Bytes of segments held by private pools. */
size_t gca__mempools_reserved_locked(const gca__devalloc_t *d);
/* Destroys every private pool's segments and records, and the routes
 * (allocator teardown). */
void gca__mempools_destroy_locked(gca__devalloc_t *d);

/* ---- freetree.c ---- */

/* Note [Free bins]: streams with bins per pool, and size classes per stream
 * (64 of 512-byte steps, then 16 per power of two). */
#define GCA__FB_STREAMS 4
#define GCA__FB_CLASSES 640
/* The size class of a block of `size` bytes (monotonic in size). */
int gca__fb_class(size_t size);

void gca__tree_insert(gca__pool_t *p, gca__block_t *b);
void gca__tree_erase(gca__pool_t *p, gca__block_t *b);
/* gca__tree_erase of b, whose stream the caller knows: a neighbour of a block
 * of `stream` (Note [Record lines]). */
void gca__tree_erase_of(gca__pool_t *p, gca__block_t *b, gca_stream_t stream);
/* Replaces old (in the tree) by nb (not in it): nb takes old's place when its
 * key still lies between old's in-order neighbours, so no rebalancing is
 * needed; otherwise old is taken out and nb inserted. One descent either way.
 * For a split remainder replacing its block, or a merged block replacing its
 * free neighbour (Note [Tree places]): old and nb lie in one segment, so
 * they share a stream, and old's is not read (Note [Record lines]). */
void gca__tree_swap(gca__pool_t *p, gca__block_t *old, gca__block_t *nb);
/* Smallest block with key >= (stream, size, 0), or NULL: always a block of
 * `stream`. */
gca__block_t *gca__tree_lower_bound(const gca__pool_t *p, gca_stream_t stream, size_t size);
/* Smallest block with key > b's key (b in the tree), or NULL. */
gca__block_t *gca__tree_next(const gca__pool_t *p, const gca__block_t *b);
/* Largest block with key < (stream, size, 0), or NULL. */
gca__block_t *gca__tree_below(const gca__pool_t *p, gca_stream_t stream, size_t size);
/* Largest block with key < b's key, or NULL. */
gca__block_t *gca__tree_prev(const gca__pool_t *p, const gca__block_t *b);
/* Whether b is reachable from the root by its key. */
bool gca__tree_contains(const gca__pool_t *p, const gca__block_t *b);
/* Checks order, heap property, bins and bitmaps; returns the node count or
 * -1 if broken. */
long gca__tree_validate(const gca__pool_t *p);
/* Frees the pool's bins (teardown; the pool holds no free block any more or
 * is being destroyed whole). */
void gca__tree_fini(gca__pool_t *p);

#include "ptrmap.h" /* the pointer map's lookups, inline */

#endif
