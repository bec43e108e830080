/* allocator.c - the caching allocator of each device and the public API.
 *
 * Device memory comes from the driver in segments (mem_alloc) and is carved
 * into blocks; a freed block goes back to its pool's free tree and is handed
 * out again without asking the driver. The rules (sizes, pools, splitting,
 * max_split_size, coalescing, out-of-memory retries, statistics) are those of
 * PyTorch's CUDACachingAllocator, so that users moving from it see the same
 * numbers. Each device has one allocator behind one mutex, which also guards
 * its pointer map; the cached alloc/free pair takes that mutex and nothing
 * else, and makes no device call and no host allocation.
 *
 * Note [Stream-ordered reuse]. A block belongs to the stream it was allocated
 * on, and work on one stream runs in order, so a block freed by the host may
 * be handed to later work on the same stream at once: that work queues behind
 * whatever still uses the block. Other streams are not ordered with it. When
 * gca_record_stream() marked a block as used on other streams, freeing it
 * records an event on each of those streams (events come from a per-device
 * pool, created once and reused) and parks the block as "pending free"; it
 * enters the free tree only when every one of its events has completed.
 * Pending events are polled without blocking (event_query) at the start of
 * each malloc and free, and only when some are pending, so the common path
 * makes no device call. Running out of memory synchronizes them instead
 * (event_synchronize), counted in num_sync_all_streams.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"
#include "history.h"
#include "introspect.h"

#define SLAB_BLOCKS   256
#define MAX_OBSERVERS 32

typedef struct observer {
  gca_oom_observer_t fn;
  void *ctx;
} observer_t;

/* Process-wide state; g_lock guards creation, configuration and observers. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(gca__devalloc_t *) g_devs[GCA__MAX_DEVICES];
static atomic_int g_single_dev = -1; /* the only device with an allocator, or -1 */
static atomic_int g_ndevs;           /* highest device index with an allocator + 1 */
static gca_alloc_config_t g_cfg;
static bool g_cfg_loaded;
static bool g_caching = true;
static bool g_trace_opened;
static observer_t g_observers[MAX_OBSERVERS];
static int g_nobservers;
static _Thread_local int t_device __attribute__((tls_model("initial-exec")));
/* t_device has been passed to the device layer's ctx_set_device on this thread. */
static _Thread_local bool t_device_told __attribute__((tls_model("initial-exec")));

#ifdef GCA_DEBUG_CHECKS
#define DEBUG_CHECK(d)                                        \
  do {                                                        \
    if (gca__devalloc_check_locked(d) != GCA_OK)              \
      gca__assert_fail(__FILE__, __LINE__, gca_last_error()); \
  } while (0)
#else
#define DEBUG_CHECK(d) ((void)0)
#endif

/* ---- size rules ---- */

size_t gca__alloc_round_size(const gca_alloc_config_t *cfg, size_t size) {
  if (size < GCA__MIN_BLOCK_SIZE)
    return GCA__MIN_BLOCK_SIZE;
  uint32_t divisions = gca__config_roundup_divisions(cfg, size);
  if (divisions > 1 && size > GCA__MIN_BLOCK_SIZE * divisions) {
    if ((size & (size - 1)) == 0)
      return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll(size));
    size_t step = floor2 >> (31 - __builtin_clz(divisions));
    if (step == 0)
      return floor2 << 1;
    size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
  }
  return GCA__MIN_BLOCK_SIZE * ((size + GCA__MIN_BLOCK_SIZE - 1) / GCA__MIN_BLOCK_SIZE);
}

size_t gca__alloc_segment_size(size_t rounded) {
  if (rounded <= GCA__SMALL_SIZE)
    return GCA__SMALL_BUFFER;
  if (rounded < GCA__MIN_LARGE_ALLOC)
    return GCA__LARGE_BUFFER;
  return GCA__ROUND_LARGE * ((rounded + GCA__ROUND_LARGE - 1) / GCA__ROUND_LARGE);
}

bool gca__alloc_should_split(const gca_alloc_config_t *cfg, bool small_pool, size_t block_size,
                             size_t rounded) {
  size_t remaining = block_size - rounded;
  if (small_pool)
    return remaining >= GCA__MIN_BLOCK_SIZE;
  return rounded < cfg->max_split_size && remaining > GCA__SMALL_SIZE;
}

bool gca__alloc_block_fits(const gca_alloc_config_t *cfg, size_t block_size, size_t rounded) {
  if (rounded < cfg->max_split_size && block_size >= cfg->max_split_size)
    return false; /* an oversize block does not serve a splittable request */
  if (rounded >= cfg->max_split_size && block_size - rounded >= cfg->max_non_split_rounding)
    return false; /* nor a much smaller oversize request */
  return true;
}

/* ---- statistics ---- */

static void stats_fill_all(gca_stats_t *s) {
  gca_stat_t *arrays[] = {
      s->allocation,      s->segment,        s->active,       s->inactive_split,
      s->allocated_bytes, s->reserved_bytes, s->active_bytes, s->inactive_split_bytes,
      s->requested_bytes};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(arrays); i++) {
    gca_stat_t *a = arrays[i];
    a[GCA_STAT_ALL].allocated = a[GCA_STAT_SMALL].allocated + a[GCA_STAT_LARGE].allocated;
    a[GCA_STAT_ALL].freed = a[GCA_STAT_SMALL].freed + a[GCA_STAT_LARGE].freed;
  }
}

/* One derived active statistic (Note [Active statistics]). */
static void stat_active(gca_stat_t *active, const gca_stat_t *alloc, const gca__pend_stat_t *p) {
  active->current = alloc->current + p->current;
  active->peak = alloc->peak > p->peak ? alloc->peak : p->peak;
  active->allocated = alloc->allocated;
  active->freed = alloc->freed + p->base - p->current;
}

void gca__stats_read(const gca__devalloc_t *d, gca_stats_t *out) {
  *out = d->stats;
  stats_fill_all(out);
  for (int t = 0; t < GCA_STAT_TYPES; t++) {
    stat_active(&out->active[t], &out->allocation[t], &d->pend[t]);
    stat_active(&out->active_bytes[t], &out->allocated_bytes[t], &d->pend_bytes[t]);
  }
}

static void fc_update(gca__devalloc_t *d);

static void set_config_locked(gca__devalloc_t *d, const gca_alloc_config_t *cfg) {
  d->cfg = *cfg;
  d->has_divisions = false;
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
    d->has_divisions |= cfg->roundup_power2_divisions[i] > 1;
  d->stats.max_split_size =
      cfg->max_split_size >= (uint64_t)INT64_MAX ? -1 : (int64_t)cfg->max_split_size;
  fc_update(d);
}

static inline size_t round_request(const gca__devalloc_t *d, size_t size) {
  if (GCA_UNLIKELY(d->has_divisions))
    return gca__alloc_round_size(&d->cfg, size);
  if (size < GCA__MIN_BLOCK_SIZE)
    return GCA__MIN_BLOCK_SIZE;
  return (size + GCA__MIN_BLOCK_SIZE - 1) & ~(GCA__MIN_BLOCK_SIZE - 1);
}

/* ---- block structs ---- */

/* Makes sure one block struct is available, so that later steps cannot fail. */
static gca_status_t block_reserve(gca__devalloc_t *d) {
  if (GCA_LIKELY(d->block_free != NULL))
    return GCA_OK;
  if (d->nslabs == d->cap_slabs) {
    size_t ncap = d->cap_slabs ? d->cap_slabs * 2 : 16;
    void **n = realloc(d->slabs, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for block records");
    d->slabs = n;
    d->cap_slabs = ncap;
  }
  gca__block_t *slab = calloc(SLAB_BLOCKS, sizeof(*slab));
  if (slab == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for block records");
  d->slabs[d->nslabs++] = slab;
  for (size_t i = 0; i < SLAB_BLOCKS; i++) {
    slab[i].next = d->block_free;
    d->block_free = &slab[i];
  }
  return GCA_OK;
}

/* Takes a struct reserved by block_reserve(). */
static gca__block_t *block_take(gca__devalloc_t *d) {
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
  b->allocated = b->in_tree = b->oversize = b->unmapped = b->cached = false;
  b->fc_epoch = 0;
  d->live_blocks++;
  return b;
}

static void block_put(gca__devalloc_t *d, gca__block_t *b) {
  if (GCA_UNLIKELY(b->uses != NULL)) {
    free(b->uses);
    b->uses = NULL;
  }
  b->next = d->block_free;
  d->block_free = b;
  d->live_blocks--;
}

gca_status_t gca__block_new(gca__devalloc_t *d, gca__block_t **out) {
  GCA_CHECK(block_reserve(d));
  *out = block_take(d);
  return GCA_OK;
}

void gca__block_free(gca__devalloc_t *d, gca__block_t *b) {
  block_put(d, b);
}

static inline bool block_whole(const gca__block_t *b) {
  return b->prev == NULL && b->next == NULL;
}

/* ---- segments ---- */

/* Note [VMM-backed classic segments]. With ipc_handles:True a classic segment
 * is one mem_create handle of the segment's size, reserved and mapped once at
 * offset 0 (seg->maps[0], nmaps == 1, expandable false), instead of a
 * mem_alloc allocation, so that gca_ipc_export can hand it to another process
 * as a file descriptor. It behaves as any classic segment: it never grows,
 * counts one num_device_alloc / num_device_free, and is released whole. */

/* Creates, reserves, maps and opens [*out, *out + size) for d's device and its
 * peers, recording the handle in seg->maps; on failure nothing is left. */
static gca_status_t vmm_segment_create(gca__devalloc_t *d, gca__segment_t *seg, size_t size,
                                       gca_devptr_t *out) {
  gca_status_t st;
  gca_memhandle_t h = 0;
  gca_devptr_t ptr = 0;
  int devs[GCA__MAX_DEVICES + 1];
  gca__mapping_t *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a segment mapping");
  GCA_CHECK_GOTO(d->ops->mem_create(d->device, size, &h), st, fail_rec);
  GCA_CHECK_GOTO(d->ops->mem_address_reserve(d->device, size, 0, &ptr), st, fail_handle);
  GCA_CHECK_GOTO(d->ops->mem_map(ptr, size, 0, h), st, fail_range);
  devs[0] = d->device;
  for (int i = 0; i < d->npeers; i++)
    devs[1 + i] = d->peers[i];
  GCA_CHECK_GOTO(d->ops->mem_set_access(ptr, size, devs, 1 + d->npeers), st, fail_map);
  m->offset = 0;
  m->size = size;
  m->handle = h;
  seg->maps = m;
  seg->nmaps = seg->cap_maps = 1;
  *out = ptr;
  return GCA_OK;

fail_map:
  (void)d->ops->mem_unmap(ptr, size);
fail_range:
  (void)d->ops->mem_address_free(d->device, ptr, size);
fail_handle:
  (void)d->ops->mem_release(h);
fail_rec:
  free(m);
  return st;
}

/* Returns a classic segment's memory to the driver: mem_free, or for a
 * VMM-backed one unmap (after its stream is done when `sync`), release and
 * unreserve; once unmapped the memory is gone, so later failures are only
 * logged. The caller keeps the record and its owner entry. */
static gca_status_t segment_memory_free(gca__devalloc_t *d, gca__segment_t *seg, bool sync) {
  if (seg->maps == NULL)
    return d->ops->mem_free(d->device, seg->base);
  if (sync)
    GCA_CHECK(d->ops->stream_synchronize(seg->stream));
  GCA_CHECK(d->ops->mem_unmap(seg->base, seg->size));
  if (d->ops->mem_release(seg->maps[0].handle) != GCA_OK ||
      d->ops->mem_address_free(d->device, seg->base, seg->size) != GCA_OK)
    GCA_LOG_WARN("segment 0x%" PRIx64 " (%zu bytes) unmapped but not fully released: %s", seg->base,
                 seg->size, gca_last_error());
  free(seg->maps);
  seg->maps = NULL;
  seg->nmaps = seg->cap_maps = 0;
  return GCA_OK;
}

/* Gets a new segment of `size` bytes from the driver; its single block is
 * returned free and outside the tree. With expandable segments, grows the
 * (pool, stream) expandable segment instead by what `rounded` needs, at least
 * `size` where room allows, and returns the block that serves it.
 * GCA_ERR_OUT_OF_MEMORY when the driver or the memory limit refuses. */
static gca_status_t segment_alloc(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                  size_t size, size_t rounded, bool retry, gca__block_t **out) {
  gca_status_t st;
  gca_devptr_t ptr = 0;
  if (retry)
    d->stats.num_alloc_retries++;
  if (d->cfg.expandable_segments)
    return gca__expand_alloc(d, pool, stream, rounded, size, out);
  if (d->cfg.ipc_handles) {
    if (d->granularity == 0) {
      GCA_CHECK(d->ops->mem_granularity(d->device, false, &d->granularity));
      if (d->granularity == 0 || (d->granularity & (d->granularity - 1)) != 0) {
        size_t g = d->granularity;
        d->granularity = 0;
        return gca__error(GCA_ERR_DRIVER,
                          "mem_granularity: device %d reports %zu bytes, expected a power of two",
                          d->device, g);
      }
    }
    size = (size + d->granularity - 1) & ~(d->granularity - 1);
  }
  if (d->set_fraction && d->reserved + d->reserving + size > d->allowed_max)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: a %zu-byte segment would pass device %d's limit of %zu bytes "
                      "(%zu reserved%s)",
                      size, d->device, d->allowed_max, d->reserved + d->reserving,
                      d->reserving != 0 ? ", some being allocated by other threads" : "");
  gca__segment_t *seg = calloc(1, sizeof(*seg));
  if (seg == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a segment record");
  if (d->cfg.ipc_handles) {
    GCA_CHECK_GOTO(vmm_segment_create(d, seg, size, &ptr), st, fail_seg);
  } else if (d->cfg.release_lock_on_device_alloc && pool->owner == NULL && d->ncaptures == 0) {
    /* PyTorch's release_lock_on_cudamalloc: other threads use the cache while
     * the driver allocates; the bytes count against the limit meanwhile. The
     * new segment is this thread's alone until it is linked in below. */
    d->reserving += size;
    gca__mutex_unlock(&d->lock);
    st = d->ops->mem_alloc(d->device, size, &ptr);
    gca__dev_lock(d);
    d->reserving -= size;
    GCA_CHECK_GOTO(st, st, fail_seg);
  } else {
    GCA_CHECK_GOTO(d->ops->mem_alloc(d->device, size, &ptr), st, fail_seg);
  }
  seg->base = ptr;
  seg->size = size;
  seg->stream = stream;
  GCA_CHECK_GOTO(block_reserve(d), st, fail_mem); /* after the driver call: the lock may have
                                                     been let go */
  GCA_CHECK_GOTO(gca__owner_add(ptr, size, d->device), st, fail_mem);
  gca__block_t *b = block_take(d);
  b->addr = ptr;
  b->size = size;
  b->stream = stream;
  b->pool = pool;
  b->seg = seg;
  seg->pool = pool;
  seg->head = b;
  seg->oversize = size >= d->cfg.max_split_size;
  seg->next = pool->segments;
  if (pool->segments != NULL)
    pool->segments->prev = seg;
  pool->segments = seg;
  pool->nsegments++;
  d->reserved += size;
  gca__stat_pool(d->stats.segment, pool, 1);
  gca__stat_pool(d->stats.reserved_bytes, pool, (int64_t)size);
  if (seg->oversize)
    gca__stat_add(&d->stats.oversize_segments, 1);
  d->stats.num_device_alloc++;
  gca__history_event(GCA_HA_SEGMENT_ALLOC, d->device, ptr, size, stream);
  *out = b;
  return GCA_OK;

fail_mem:
  (void)segment_memory_free(d, seg, false);
fail_seg:
  free(seg);
  return st;
}

/* Returns a segment whose single block is free (in the tree) to the driver. */
static gca_status_t segment_release(gca__devalloc_t *d, gca__segment_t *seg) {
  gca__block_t *b = seg->head;
  gca__pool_t *pool = seg->pool;
  if (seg->expandable)
    return gca__expand_release(d, seg, NULL);
  GCA_ASSERT(block_whole(b) && b->in_tree);
  gca_status_t st = segment_memory_free(d, seg, true);
  if (st != GCA_OK)
    return gca__error_prefix(st, "release of segment 0x%" PRIx64 " (%zu bytes)", seg->base,
                             seg->size);
  gca__owner_remove(seg->base, seg->size, d->device);
  gca__tree_erase(pool, b);
  block_put(d, b);
  if (seg->prev != NULL)
    seg->prev->next = seg->next;
  else
    pool->segments = seg->next;
  if (seg->next != NULL)
    seg->next->prev = seg->prev;
  pool->nsegments--;
  d->reserved -= seg->size;
  gca__stat_pool(d->stats.segment, pool, -1);
  gca__stat_pool(d->stats.reserved_bytes, pool, -(int64_t)seg->size);
  if (seg->oversize)
    gca__stat_add(&d->stats.oversize_segments, -1);
  d->stats.num_device_free++;
  gca__history_event(GCA_HA_SEGMENT_FREE, d->device, seg->base, seg->size, seg->stream);
  free(seg);
  return GCA_OK;
}

/* ---- free and allocate within the pools ---- */

static bool gc_enabled(const gca__devalloc_t *d) {
  return d->set_fraction && d->cfg.garbage_collection_threshold > 0.0;
}

/* ---- the free cache ----
 *
 * Note [Free cache]. The cached alloc/free pair of PyTorch's rules splits a
 * free block on every malloc and merges it back on every free: with the tree
 * updates, the pointer map and the statistics that is several hundred
 * instructions, where glibc's malloc+free of a small size is a few dozen. So a
 * free may instead put the block into a small per-device cache, binned by
 * (stream, size), without coalescing it, and a later malloc of exactly that
 * rounded size on that stream takes the newest one back: no tree, no split,
 * no merge, and the block never left the pointer map. Only plain frees are
 * cached: the block has no recorded streams, belongs to a default pool, no
 * capture is under way, caching is on, garbage collection is off, and the
 * free_cache key is True (its default).
 *
 * A malloc that misses (any other size or stream) flushes the whole cache
 * first, so it searches exactly the free blocks PyTorch's rules would have,
 * merged as they would be; the cache only defers coalescing until then.
 *
 * What stays exactly as without the cache:
 * - Statistics, peaks included, at every moment. A cached block counts as
 *   free, and inactive_split counts it as if it had been merged with its free
 *   neighbours (fc_run_delta). For that to be computable in O(1), a block is
 *   cached only when no block within two places of it is cached, so the
 *   logical free run of a cached block X is just {prev if free, X, next if
 *   free}, and that run cannot change while X is cached: anything about to
 *   touch it takes X out of the cache first (fc_evict_near, called by
 *   block_free_complete and pool_take_fit).
 * - Memory use: a miss flushes before it searches, and every release path
 *   (empty_cache, out of memory, garbage collection, turning caching off)
 *   flushes first, so cached blocks never cost a segment.
 * - What snapshots show: the walk flushes first.
 * - Error reports: a cached pointer is not live (double free, record_stream,
 *   pointer_info, IPC export say so).
 * What differs: which block a request of a cached (stream, size) receives.
 * PyTorch's best fit would search the merged free blocks (and could pick a
 * smaller-keyed one); the cache returns the block of that size freed last.
 * free_cache:False restores PyTorch's placement exactly. */

static inline gca__fcbin_t *fc_bin(gca__devalloc_t *d, gca_stream_t stream, size_t size) {
  uint64_t h = ((uint64_t)(uintptr_t)stream ^ (size >> 9)) * 0x9e3779b97f4a7c15ull;
  return &d->fc_bins[h >> (64 - 6)];
}
_Static_assert(GCA__FC_BINS == 64, "fc_bin takes 6 bits of the hash");

/* Merges b (free, outside the tree) with its free neighbours and puts the
 * result in the tree, taking a neighbour's tree place where it can (Note
 * [Tree places]). Returns the change in inactive_split through the pointers;
 * statistics are the caller's. */
static void block_coalesce(gca__devalloc_t *d, gca__block_t *b, int64_t *blocks, int64_t *bytes) {
  gca__pool_t *pool = b->pool;
  int64_t net_blocks = 0, net_bytes = 0;
  gca__block_t *p = b->prev, *n = b->next;
  bool pfree = p != NULL && p->in_tree, nfree = n != NULL && n->in_tree;
  /* with exactly one free neighbour, b may take its tree place (Note [Tree places]) */
  gca__block_t *slot = pfree != nfree ? (pfree ? p : n) : NULL;
  if (pfree) {
    if (p != slot)
      gca__tree_erase(pool, p);
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (b->prev != NULL)
      b->prev->next = b;
    else
      b->seg->head = b;
    net_blocks--;
    net_bytes -= (int64_t)p->size;
  }
  if (nfree) {
    if (n != slot)
      gca__tree_erase(pool, n);
    b->size += n->size;
    b->next = n->next;
    if (b->next != NULL)
      b->next->prev = b;
    net_blocks--;
    net_bytes -= (int64_t)n->size;
  }
  b->gc_base = pool->free_calls;
  if (slot != NULL)
    gca__tree_swap(pool, slot, b);
  else
    gca__tree_insert(pool, b);
  if (pfree)
    block_put(d, p);
  if (nfree)
    block_put(d, n);
  if (!block_whole(b)) {
    net_blocks++;
    net_bytes += (int64_t)b->size;
  }
  *blocks = net_blocks;
  *bytes = net_bytes;
}

/* Takes b out of its bin; the caller clears b->cached. */
static void fc_unlink(gca__devalloc_t *d, gca__block_t *b) {
  gca__fcbin_t *bin = fc_bin(d, b->stream, b->size);
  gca__block_t **link = &bin->head;
  while (*link != b) {
    GCA_ASSERT(*link != NULL);
    link = &(*link)->left;
  }
  *link = b->left;
  b->left = NULL;
  bin->n--;
  d->fc_count--;
}

/* Returns a cached block to the free tree: out of the pointer map, merged
 * with its free neighbours. Statistics already count it as merged. */
static void fc_evict(gca__devalloc_t *d, gca__block_t *b) {
  int64_t blocks, bytes;
  fc_unlink(d, b);
  b->cached = false;
  GCA_ASSERT(gca__ptrmap_take(&d->ptrs, b->addr) == b);
  block_coalesce(d, b, &blocks, &bytes);
  GCA_ASSERT(blocks == b->fc_blocks && bytes == b->fc_bytes); /* its run did not change */
}

/* Whether a cached block shares a free run with b's neighbours. */
static inline bool fc_near(const gca__block_t *b) {
  return gca__fc_cached_below(b) != NULL || gca__fc_cached_above(b) != NULL;
}

/* Evicts the cached blocks that share a free run with b's neighbours, before
 * b's state changes (Note [Free cache]). Both are found first: when b is in
 * the tree, the first eviction merges b away. */
static void fc_evict_near(gca__devalloc_t *d, gca__block_t *b) {
  gca__block_t *below = gca__fc_cached_below(b), *above = gca__fc_cached_above(b);
  if (below != NULL)
    fc_evict(d, below);
  if (above != NULL)
    fc_evict(d, above);
}

static void fc_evict_bin(gca__devalloc_t *d, gca__fcbin_t *bin) {
  while (bin->head != NULL)
    fc_evict(d, bin->head);
}

void gca__fcache_flush(gca__devalloc_t *d) {
  for (size_t i = 0; i < GCA__FC_BINS && d->fc_count != 0; i++)
    fc_evict_bin(d, &d->fc_bins[i]);
}

/* Recomputes fc_on after a setting changed; flushes when caching stops. */
static void fc_update(gca__devalloc_t *d) {
  d->fc_on = d->cfg.free_cache && d->caching && !gc_enabled(d); /* GC needs block ages */
  if (!d->fc_on)
    gca__fcache_flush(d);
}

/* Whether the allocated block b of the default pool, with no recorded
 * streams, may go into `bin` (its bin) now: the bin holds its (stream, size)
 * or nothing and has room, and no cached block is too near. When it may,
 * b->fc_blocks/fc_bytes say how caching it changes inactive_split; they are
 * computed only when b's epoch is not current (Note [Free cache epochs]). */
static inline __attribute__((always_inline)) bool
fc_fits(const gca__devalloc_t *d, const gca__fcbin_t *bin, gca__block_t *b) {
  if ((bin->n != 0 && (bin->stream != b->stream || bin->size != b->size)) ||
      bin->n == GCA__FC_BIN_MAX)
    return false;
  if (b->fc_epoch == d->epoch)
    return true;
  if (fc_near(b))
    return false;
  int64_t blocks, bytes;
  gca__fc_run_delta(b, &blocks, &bytes);
  b->fc_blocks = (int32_t)blocks; /* the run cannot change while b is cached */
  b->fc_bytes = bytes;
  return true;
}

/* Whether the free of live block b may be cached now (Note [Free cache]):
 * the cache is on, nothing waits for events, no capture routes frees, and b
 * is a plain block of a default pool. */
static inline bool fc_cacheable(const gca__devalloc_t *d, const gca__block_t *b) {
  return d->fc_on && (d->npending | d->ndeferred | d->ncaptures) == 0 && b->nuses == 0 &&
         b->pool->owner == NULL;
}

/* Frees the allocated block b into `bin` (fc_fits said yes) with the
 * statistics of a completed free; b stays in the pointer map. History is the
 * caller's. */
static inline __attribute__((always_inline)) void fc_put(gca__devalloc_t *d, gca__fcbin_t *bin,
                                                         gca__block_t *b) {
  int t = gca__stat_type(b->pool);
  int64_t blocks = b->fc_blocks, bytes = b->fc_bytes;
  b->fc_epoch = ++d->epoch;
  b->allocated = false;
  gca__stat_dec_t(d->stats.allocation, t, 1);
  gca__stat_dec_t(d->stats.allocated_bytes, t, (int64_t)b->size);
  if (b->oversize)
    gca__stat_add(&d->stats.oversize_allocations, -1);
  b->oversize = false;
  gca__stat_add_t(d->stats.inactive_split, t, blocks);
  gca__stat_add_t(d->stats.inactive_split_bytes, t, bytes);
  gca__stat_dec_t(d->stats.requested_bytes, t, (int64_t)b->requested);
  b->requested = 0;
  b->cached = true;
  bin->stream = b->stream;
  bin->size = b->size;
  b->left = bin->head;
  bin->head = b;
  bin->n++;
  d->fc_count++;
}

/* The free path's attempt at the cache, with history: true when b (live,
 * d->lock held, events processed) is now cached. */
static bool fc_try_put(gca__devalloc_t *d, gca__block_t *b) {
  if (!fc_cacheable(d, b))
    return false;
  gca__fcbin_t *bin = fc_bin(d, b->stream, b->size);
  if (bin->n != 0 && (bin->stream != b->stream || bin->size != b->size))
    fc_evict_bin(d, bin); /* another (stream, size) hashed here: the newer wins */
  if (!fc_fits(d, bin, b))
    return false;
  gca_devptr_t addr = b->addr;
  uint64_t requested = b->requested;
  fc_put(d, bin, b);
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, addr, requested, b->stream);
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, addr, requested, b->stream);
  return true;
}

/* The newest cached block of exactly (stream, rounded) in `pool`, made
 * active for `requested` bytes (PyTorch's statistics of an allocation that
 * did not split), or NULL. `quiet`: nothing is pending (the caller checked),
 * so active's peak needs no update (Note [Active statistics]). */
static inline __attribute__((always_inline)) gca__block_t *
fc_take(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream, size_t rounded,
        size_t requested, bool quiet) {
  gca__fcbin_t *bin = fc_bin(d, stream, rounded);
  gca__block_t *b = bin->head;
  if (b == NULL || bin->stream != stream || bin->size != rounded || b->pool != pool)
    return NULL;
  bin->head = b->left;
  b->left = NULL;
  bin->n--;
  d->fc_count--;
  b->cached = false;
  int t = gca__stat_type(pool);
  gca__stat_add_t(d->stats.inactive_split, t, -(int64_t)b->fc_blocks);
  gca__stat_add_t(d->stats.inactive_split_bytes, t, -b->fc_bytes);
  b->allocated = true;
  b->requested = requested;
  gca__stat_inc_t(d->stats.allocation, t, 1);
  gca__stat_inc_t(d->stats.allocated_bytes, t, (int64_t)b->size);
  if (!quiet && GCA_UNLIKELY(d->pend[GCA_STAT_ALL].current != 0))
    gca__pend_peak(d, t);
  gca__stat_inc_t(d->stats.requested_bytes, t, (int64_t)requested);
  b->oversize = b->size >= d->cfg.max_split_size;
  if (b->oversize)
    gca__stat_add(&d->stats.oversize_allocations, 1);
  return b;
}

/* ---- freeing into the tree ---- */

/* Puts a block whose last use has completed into the free tree, merging it
 * with free neighbours (PyTorch's free_block); `pending`: it was pending-free. */
static void block_free_complete(gca__devalloc_t *d, gca__block_t *b, bool pending) {
  gca__pool_t *pool = b->pool;
  gca__mempool_t *owner = pool->owner;
  size_t requested = b->requested;
  int64_t net_blocks, net_bytes;
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, b->addr, requested, b->stream);
  if (GCA_UNLIKELY(d->fc_count != 0))
    fc_evict_near(d, b);
  b->requested = 0;
  if (pending)
    gca__pend_add(d, pool, -1, b->size);
  block_coalesce(d, b, &net_blocks, &net_bytes);
  gca__stat_pool(d->stats.inactive_split, pool, net_blocks);
  gca__stat_pool(d->stats.inactive_split_bytes, pool, net_bytes);
  gca__stat_dec(d->stats.requested_bytes, pool, (int64_t)requested);
  if (!d->caching && block_whole(b)) {
    gca_status_t st = segment_release(d, b->seg);
    if (st != GCA_OK)
      GCA_LOG_WARN("free: caching is off but the segment stays cached: %s", gca_last_error());
  }
  if (GCA_UNLIKELY(owner != NULL))
    gca__mempool_block_freed(d, owner); /* may release b's segment */
}

/* Best fit in the pool for the stream (PyTorch's get_free_block); removes it
 * from the tree. */
static gca__block_t *pool_take_fit(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                   size_t rounded) {
  if (GCA_UNLIKELY(gc_enabled(d)))
    pool->free_calls++;
  gca__block_t *b = gca__tree_lower_bound(pool, stream, rounded);
  /* a cached neighbour's free run is about to change: merge it in and look again */
  while (GCA_UNLIKELY(d->fc_count != 0) && b != NULL && fc_near(b)) {
    fc_evict_near(d, b);
    b = gca__tree_lower_bound(pool, stream, rounded);
  }
  if (b == NULL || b->stream != stream || !gca__alloc_block_fits(&d->cfg, b->size, rounded))
    return NULL;
  return b; /* still in the tree: block_activate takes it out (Note [Tree places]) */
}

/* Makes a free block (outside the tree) active for a request, splitting off
 * the remainder when the rules say so (PyTorch's alloc_found_block). A block
 * struct must have been reserved. */
/* Note [Tree places]: a fitting block found in its pool's free tree stays there
 * until block_activate; a split remainder (key: same stream, smaller size,
 * higher address) then usually takes the block's own place, and a freed block
 * merged with one free neighbour usually takes that neighbour's, each without
 * rebalancing (gca__tree_swap). Blocks from a new segment arrive outside
 * the tree. */
static void block_activate(gca__devalloc_t *d, gca__block_t *b, size_t rounded, size_t requested) {
  gca__pool_t *pool = b->pool;
  bool already_split = !block_whole(b);
  bool in_tree = b->in_tree;
  if (!pool->no_split &&
      gca__alloc_should_split(&d->cfg, pool->is_small || b->seg->expandable, b->size, rounded)) {
    gca__block_t *r = block_take(d);
    r->addr = b->addr + rounded;
    r->size = b->size - rounded;
    r->stream = b->stream;
    r->pool = pool;
    r->seg = b->seg;
    r->gc_base = pool->free_calls;
    if (in_tree)
      gca__tree_swap(pool, b, r);
    else
      gca__tree_insert(pool, r);
    r->prev = b;
    r->next = b->next;
    if (r->next != NULL)
      r->next->prev = r;
    b->next = r;
    b->size = rounded;
    if (already_split) {
      gca__stat_pool(d->stats.inactive_split_bytes, pool, -(int64_t)rounded);
    } else {
      gca__stat_pool(d->stats.inactive_split_bytes, pool, (int64_t)r->size);
      gca__stat_pool(d->stats.inactive_split, pool, 1);
    }
  } else {
    if (in_tree)
      gca__tree_erase(pool, b);
    if (already_split) {
      gca__stat_pool(d->stats.inactive_split_bytes, pool, -(int64_t)b->size);
      gca__stat_pool(d->stats.inactive_split, pool, -1);
    }
  }
  b->allocated = true;
  b->requested = requested;
  gca__stat_inc(d->stats.allocation, pool, 1);
  gca__stat_inc(d->stats.allocated_bytes, pool, (int64_t)b->size);
  if (GCA_UNLIKELY(d->pend[GCA_STAT_ALL].current != 0))
    gca__pend_peak(d, gca__stat_type(pool));
  gca__stat_inc(d->stats.requested_bytes, pool, (int64_t)requested);
  b->oversize = b->size >= d->cfg.max_split_size;
  if (b->oversize)
    gca__stat_add(&d->stats.oversize_allocations, 1);
}

/* ---- pending frees (Note [Stream-ordered reuse]) ---- */

/* Returns an event of device `dev` to its pool. */
static void event_put(gca__devalloc_t *d, int dev, gca_event_t ev) {
  gca__evpool_t *p = &d->events[dev];
  GCA_ASSERT(p->n < p->cap && p->out > 0);
  p->ev[p->n++] = ev;
  p->out--;
}

/* Takes a pooled event of device `dev` (events_reserve made one). */
static gca_event_t event_take(gca__devalloc_t *d, int dev) {
  gca__evpool_t *p = &d->events[dev];
  GCA_ASSERT(p->n > 0);
  p->out++;
  return p->ev[--p->n];
}

/* Makes room for b's uses: a pending entry each and a pooled event on each
 * use's device (created there once, then reused). */
static gca_status_t events_reserve(gca__devalloc_t *d, const gca__block_t *b) {
  if (d->npending + b->nuses > d->cap_pending) {
    size_t ncap = d->cap_pending ? d->cap_pending : 16;
    while (ncap < d->npending + b->nuses)
      ncap *= 2;
    gca__pending_t *p = realloc(d->pending, ncap * sizeof(*p));
    if (p == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "free: host out of memory for pending events");
    d->pending = p;
    d->cap_pending = ncap;
  }
  uint32_t needs[GCA__MAX_DEVICES] = {0};
  for (uint32_t i = 0; i < b->nuses; i++)
    needs[b->uses[i].dev]++;
  for (int dev = 0; dev < GCA__MAX_DEVICES; dev++) {
    size_t need = needs[dev];
    if (need == 0)
      continue;
    gca__evpool_t *p = &d->events[dev];
    /* every event is either pooled or out, so the pool never holds more */
    size_t want = p->n + p->out + need;
    if (want > p->cap) {
      gca_event_t *e = realloc(p->ev, want * 2 * sizeof(*e));
      if (e == NULL)
        return gca__error(GCA_ERR_OUT_OF_MEMORY, "free: host out of memory for the event pool");
      p->ev = e;
      p->cap = want * 2;
    }
    while (p->n < need) {
      gca_event_t ev;
      GCA_CHECK(d->ops->event_create(dev, GCA_EVENT_DISABLE_TIMING, &ev));
      p->ev[p->n++] = ev;
    }
  }
  return GCA_OK;
}

/* Runs a stream op for use u with u's device current when its stream is
 * NULL (that device's legacy stream), as PyTorch sets the device around it. */
static gca_status_t use_op(gca__devalloc_t *d, const gca__use_t *u, gca_event_t ev) {
  int cur = u->dev;
  gca_status_t st;
  if (u->stream == NULL) {
    GCA_CHECK(d->ops->ctx_get_device(&cur));
    if (cur != u->dev)
      GCA_CHECK(d->ops->ctx_set_device(u->dev));
  }
  st = ev != NULL ? d->ops->event_record(ev, u->stream) : d->ops->stream_synchronize(u->stream);
  if (cur != u->dev) {
    gca_status_t rst = d->ops->ctx_set_device(cur);
    if (st == GCA_OK)
      st = rst;
  }
  return st;
}

/* Parks a block used on other streams while a capture is under way: it is
 * pending (event_count 1) until gca__alloc_flush_deferred records its events
 * (Note [Frees during capture], pool.c). */
static gca_status_t defer_free(gca__devalloc_t *d, gca__block_t *b) {
  if (d->ndeferred == d->cap_deferred) {
    size_t ncap = d->cap_deferred ? d->cap_deferred * 2 : 16;
    gca__block_t **n = realloc(d->deferred, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY,
                        "free: host out of memory deferring the free of 0x%" PRIx64, b->addr);
    d->deferred = n;
    d->cap_deferred = ncap;
  }
  d->deferred[d->ndeferred++] = b;
  b->event_count = 1;
  return GCA_OK;
}

/* Records an event on each stream that used b, on that stream's device; b
 * becomes pending. On failure nothing changed. */
static gca_status_t block_insert_events(gca__devalloc_t *d, gca__block_t *b) {
  GCA_CHECK(events_reserve(d, b));
  size_t first = d->npending;
  for (uint32_t i = 0; i < b->nuses; i++) {
    const gca__use_t *u = &b->uses[i];
    gca_event_t ev = event_take(d, u->dev);
    gca_status_t st = use_op(d, u, ev);
    if (st != GCA_OK) {
      event_put(d, u->dev, ev);
      while (d->npending > first) {
        d->npending--;
        event_put(d, d->pending[d->npending].dev, d->pending[d->npending].event);
      }
      b->event_count = 0;
      return gca__error_prefix(st, "free: 0x%" PRIx64, b->addr);
    }
    d->pending[d->npending++] = (gca__pending_t){ev, u->stream, b, u->dev};
    b->event_count++;
  }
  b->nuses = 0;
  return GCA_OK;
}

static void pending_done(gca__devalloc_t *d, const gca__pending_t *e) {
  event_put(d, e->dev, e->event);
  if (--e->block->event_count == 0)
    block_free_complete(d, e->block, true);
}

/* Frees the pending blocks whose events completed, without blocking. Events on
 * one stream complete in order, so a stream is skipped after its first
 * unfinished event. */
static gca_status_t process_events(gca__devalloc_t *d) {
  gca__use_t busy[16]; /* (stream, device): NULL names a different stream on each device */
  size_t nbusy = 0, w = 0, i;
  gca_status_t st = GCA_OK;
  if (d->ncaptures != 0) /* Note [Frees during capture] */
    return GCA_OK;
  if (d->ndeferred != 0)
    GCA_CHECK(gca__alloc_flush_deferred(d));
  for (i = 0; i < d->npending; i++) {
    gca__pending_t e = d->pending[i];
    bool skip = false;
    for (size_t k = 0; k < nbusy && !skip; k++)
      skip = busy[k].stream == e.stream && busy[k].dev == e.dev;
    if (!skip) {
      st = d->ops->event_query(e.event);
      if (st == GCA_OK) {
        pending_done(d, &e);
        continue;
      }
      if (st != GCA_ERR_NOT_READY)
        break;
      st = GCA_OK;
      if (nbusy < GCA_ARRAY_SIZE(busy))
        busy[nbusy++] = (gca__use_t){e.stream, e.dev};
    }
    d->pending[w++] = e;
  }
  for (; i < d->npending; i++)
    d->pending[w++] = d->pending[i];
  d->npending = w;
  return st;
}

/* Waits for every pending event (PyTorch's synchronize_and_free_events). */
static gca_status_t sync_pending(gca__devalloc_t *d) {
  gca_status_t st = GCA_OK;
  size_t i, w = 0;
  d->stats.num_sync_all_streams++;
  for (i = 0; i < d->npending; i++) {
    gca__pending_t e = d->pending[i];
    st = d->ops->event_synchronize(e.event);
    if (st != GCA_OK)
      break;
    pending_done(d, &e);
  }
  for (; i < d->npending; i++)
    d->pending[w++] = d->pending[i];
  d->npending = w;
  return st;
}

/* ---- releasing cached memory ---- */

/* Frees every cached whole segment of the pool. */
static gca_status_t pool_release_all(gca__devalloc_t *d, gca__pool_t *pool) {
  for (gca__segment_t *s = pool->segments, *next; s != NULL; s = next) {
    next = s->next;
    if (s->expandable)
      GCA_CHECK(gca__expand_release(d, s, NULL));
    else if (block_whole(s->head) && s->head->in_tree)
      GCA_CHECK(segment_release(d, s));
  }
  return GCA_OK;
}

/* PyTorch's release_cached_blocks: wait for pending frees, then free every
 * cached whole segment. */
static gca_status_t release_cached(gca__devalloc_t *d) {
  gca__fcache_flush(d);
  GCA_CHECK(sync_pending(d));
  GCA_CHECK(pool_release_all(d, &d->large));
  GCA_CHECK(pool_release_all(d, &d->small));
  return GCA_OK;
}

/* PyTorch's release_available_cached_blocks: with max_split_size set, free
 * the smallest oversize block that covers the request, else the largest ones
 * until enough is freed. *released says whether the retry is worth it. */
static gca_status_t release_available(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                      size_t rounded, bool *released) {
  *released = false;
  uint64_t msplit = d->cfg.max_split_size;
  if (msplit == UINT64_MAX)
    return GCA_OK;
  size_t key = rounded < msplit ? (size_t)msplit : rounded;
  gca__block_t *it = gca__tree_lower_bound(pool, stream, key);
  if (it == NULL || it->stream != stream) {
    size_t total = 0;
    it = gca__tree_below(pool, stream, key);
    while (total < key && it != NULL && it->size >= msplit && it->stream == stream) {
      gca__block_t *cur = it;
      it = gca__tree_prev(pool, cur);
      if (block_whole(cur)) {
        size_t sz = cur->size;
        GCA_CHECK(segment_release(d, cur->seg));
        total += sz;
      }
    }
    if (total < key)
      return GCA_OK;
  } else {
    if (!block_whole(it))
      return GCA_OK;
    GCA_CHECK(segment_release(d, it->seg));
  }
  *released = true;
  return GCA_OK;
}

/* Garbage collection by age (PyTorch's garbage_collect_cached_blocks): once
 * reserved memory passes threshold * limit, free cached whole large segments
 * that have waited longer than average, oldest first by rounds, until the
 * excess is reclaimed. Ages count get_free_block calls. */
static gca_status_t garbage_collect(gca__devalloc_t *d) {
  gca__pool_t *pool = &d->large;
  size_t threshold = (size_t)(d->cfg.garbage_collection_threshold * (double)d->allowed_max);
  if (d->reserved <= threshold)
    return GCA_OK;
  size_t target = d->reserved - threshold, reclaimed = 0; /* GC on: the free cache is off */
  uint64_t total_age = 0;
  size_t count = 0;
  for (gca__segment_t *s = pool->segments; s != NULL; s = s->next) {
    if (block_whole(s->head) && s->head->in_tree) {
      total_age += pool->free_calls - s->head->gc_base;
      count++;
    }
  }
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    double age_threshold = (double)total_age / (double)count;
    freed = false;
    for (gca__segment_t *s = pool->segments, *next; s != NULL; s = next) {
      next = s->next;
      gca__block_t *b = s->head;
      if (!block_whole(b) || !b->in_tree)
        continue;
      uint64_t age = pool->free_calls - b->gc_base;
      if ((double)age >= age_threshold) {
        size_t sz = s->size;
        GCA_CHECK(segment_release(d, s));
        freed = true;
        reclaimed += sz;
        total_age -= age;
        count--;
      }
    }
  }
  for (gca__segment_t *s = pool->segments, *next; s != NULL && reclaimed < target; s = next) {
    next = s->next;
    if (s->expandable)
      GCA_CHECK(gca__expand_release(d, s, &reclaimed));
  }
  return GCA_OK;
}

/* ---- the device allocators ---- */

/* Loads the settings once; the caller holds g_lock. */
static gca_status_t config_load_locked(void) {
  if (g_cfg_loaded)
    return GCA_OK;
  gca_alloc_config_t cfg;
  GCA_CHECK(gca__config_from_env(&cfg));
  bool no_caching = false;
  const char *nc = gca__getenv("GCA_NO_CACHING");
  if (nc != NULL && *nc != '\0' && gca__parse_bool(nc, &no_caching) != GCA_OK)
    return gca__error(GCA_ERR_CONFIG, "GCA_NO_CACHING='%s' is not a boolean", nc);
  if (!g_trace_opened) {
    GCA_CHECK(gca__trace_open_from_env());
    g_trace_opened = true;
  }
  g_cfg = cfg;
  g_caching = !no_caching;
  g_cfg_loaded = true;
  return GCA_OK;
}

static void apply_limit_from_config(gca__devalloc_t *d) {
  if (d->cfg.per_process_memory_fraction > 0.0) {
    d->set_fraction = true;
    d->allowed_max = (size_t)(d->cfg.per_process_memory_fraction * (double)d->total_memory);
  }
}

gca__devalloc_t *gca__devalloc_peek(int device) {
  if (device < 0 || device >= GCA__MAX_DEVICES)
    return NULL;
  return atomic_load_explicit(&g_devs[device], memory_order_acquire);
}

static gca_status_t check_device_index(const char *op, int device, const gca_device_ops_t **ops) {
  gca_status_t st;
  const gca_device_ops_t *o = gca__device_get(&st);
  if (o == NULL)
    return gca__error_prefix(st, "%s", op);
  int n = 0;
  GCA_CHECK(o->device_count(&n));
  if (device < 0 || device >= n || device >= GCA__MAX_DEVICES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d is not in [0, %d)", op, device,
                      n < GCA__MAX_DEVICES ? n : GCA__MAX_DEVICES);
  if (ops != NULL)
    *ops = o;
  return GCA_OK;
}

static gca_status_t devalloc_create_locked(const char *op, int device, gca__devalloc_t **out) {
  const gca_device_ops_t *ops;
  gca_status_t st;
  GCA_CHECK(check_device_index(op, device, &ops));
  GCA_CHECK(config_load_locked());
  gca__devalloc_t *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: host out of memory for device %d", op, device);
  size_t free_bytes = 0;
  GCA_CHECK_GOTO(ops->mem_get_info(device, &free_bytes, &d->total_memory), st, fail);
  gca__mutex_init(&d->lock);
  d->epoch = 1; /* a new block's fc_epoch (0) is never current */
  d->device = device;
  d->ops = ops;
  set_config_locked(d, &g_cfg);
  d->caching = g_caching;
  d->small.dev = d->large.dev = d;
  d->small.is_small = true;
  apply_limit_from_config(d);
  fc_update(d);
  bool first = true;
  for (int i = 0; i < GCA__MAX_DEVICES && first; i++)
    first = gca__devalloc_peek(i) == NULL;
  atomic_store(&g_single_dev, first ? device : -1);
  if (device + 1 > atomic_load(&g_ndevs))
    atomic_store(&g_ndevs, device + 1);
  atomic_store_explicit(&g_devs[device], d, memory_order_release);
  *out = d;
  return GCA_OK;

fail:
  free(d);
  return st;
}

static gca_status_t devalloc_get_slow(const char *op, int device, gca__devalloc_t **out);

/* The allocator of `device`, created on first use. */
static inline gca_status_t devalloc_get(const char *op, int device, gca__devalloc_t **out) {
  gca__devalloc_t *d;
  if (GCA_LIKELY((unsigned)device < GCA__MAX_DEVICES &&
                 (d = atomic_load_explicit(&g_devs[device], memory_order_acquire)) != NULL)) {
    *out = d;
    return GCA_OK;
  }
  return devalloc_get_slow(op, device, out);
}

static gca_status_t devalloc_get_slow(const char *op, int device, gca__devalloc_t **out) {
  gca__devalloc_t *d;
  if (device < 0 || device >= GCA__MAX_DEVICES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d is out of range", op, device);
  pthread_mutex_lock(&g_lock);
  gca_status_t st = GCA_OK;
  d = gca__devalloc_peek(device);
  if (d == NULL)
    st = devalloc_create_locked(op, device, &d);
  pthread_mutex_unlock(&g_lock);
  if (st == GCA_OK)
    *out = d;
  return st;
}

/* ---- malloc ---- */

/* The pool of a routed request: the matching private pool's tree of the same
 * size class, or `pool` when no route matches. */
static gca__pool_t *routed_pool(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                size_t rounded) {
  gca__mempool_t *m = gca__route_select_locked(d, stream);
  if (m == NULL)
    return pool;
  return rounded <= GCA__SMALL_SIZE ? &m->small : &m->large;
}

/* A no_split pool's segment holds exactly one block: sized to fit. */
static size_t no_split_segment_size(size_t rounded) {
  if (rounded <= GCA__SMALL_SIZE)
    return GCA__SMALL_BUFFER;
  return GCA__ROUND_LARGE * ((rounded + GCA__ROUND_LARGE - 1) / GCA__ROUND_LARGE);
}

static void oom_fail(gca__devalloc_t *d, size_t size, size_t seg_size, gca_stream_t stream) {
  char s_req[32], s_tot[32], s_free[32], s_alloc[32], s_res[32], s_unal[32], s_lim[48] = "";
  size_t free_bytes = 0, total = d->total_memory;
  gca_status_t info = d->ops->mem_get_info(d->device, &free_bytes, &total);
  size_t allocated = (size_t)d->stats.allocated_bytes[GCA_STAT_ALL].current;
  size_t reserved = (size_t)d->stats.reserved_bytes[GCA_STAT_ALL].current;
  size_t private_bytes = gca__mempools_reserved_locked(d);
  char s_priv[32];
  d->stats.num_ooms++;
  gca__history_event(GCA_HA_OOM, d->device, free_bytes, seg_size, stream);
  gca__history_alloc_failure(d->device, size, stream);
  observer_t obs[MAX_OBSERVERS];
  int nobs;
  int device = d->device;
  bool limited = d->set_fraction;
  size_t allowed = d->allowed_max;
  gca__mutex_unlock(&d->lock);

  pthread_mutex_lock(&g_lock);
  nobs = g_nobservers;
  memcpy(obs, g_observers, sizeof(obs[0]) * (size_t)nobs);
  pthread_mutex_unlock(&g_lock);
  for (int i = 0; i < nobs; i++)
    obs[i].fn(device, size, allocated, free_bytes, obs[i].ctx);

  if (limited) {
    char t[32];
    snprintf(s_lim, sizeof(s_lim), "; limit %s", gca__format_size(allowed, t, sizeof(t)));
  }
  gca__error(GCA_ERR_OUT_OF_MEMORY,
             "malloc: out of memory on device %d: tried to allocate %s (%zu bytes requested, "
             "segment of %zu bytes); device total %s, %s free%s; allocated %s, reserved %s, "
             "reserved but unallocated %s, private pools %s%s",
             device, gca__format_size(size, s_req, sizeof(s_req)), size, seg_size,
             gca__format_size(total, s_tot, sizeof(s_tot)),
             gca__format_size(free_bytes, s_free, sizeof(s_free)),
             info == GCA_OK ? "" : " (mem_get_info failed)",
             gca__format_size(allocated, s_alloc, sizeof(s_alloc)),
             gca__format_size(reserved, s_res, sizeof(s_res)),
             gca__format_size(reserved - allocated, s_unal, sizeof(s_unal)),
             gca__format_size(private_bytes, s_priv, sizeof(s_priv)), s_lim);
}

/* malloc with d->lock held; returns with it released. */
static __attribute__((noinline)) gca_status_t dev_malloc_locked(gca__devalloc_t *d, void **out,
                                                                size_t size, gca_stream_t stream) {
  gca_status_t st;
  gca__block_t *b = NULL;
  d->epoch++; /* Note [Free cache epochs] */
  if (GCA_UNLIKELY(d->npending != 0 || d->ndeferred != 0))
    GCA_CHECK_GOTO(process_events(d), st, fail);
  GCA_CHECK_GOTO(block_reserve(d), st, fail);
  size_t rounded = round_request(d, size);
  gca__pool_t *pool = rounded <= GCA__SMALL_SIZE ? &d->small : &d->large;
  if (GCA_UNLIKELY(atomic_load_explicit(&d->routing, memory_order_relaxed) != 0)) {
    pool = routed_pool(d, pool, stream, rounded);
    if (pool->owner != NULL && pool->owner->suspended) {
      st = gca__error(GCA_ERR_INVALID_STATE,
                      "malloc: the pool %#" PRIx64 " this request is routed to is suspended; "
                      "resume it first",
                      pool->owner->handle);
      goto fail;
    }
  }
  if (d->fc_count != 0 && pool->owner == NULL) {
    b = fc_take(d, pool, stream, rounded, size, false);
    if (b != NULL)
      goto out;
    /* a miss searches what PyTorch's rules would: every earlier free merged */
    gca__fcache_flush(d);
  }
  size_t seg_size = d->caching ? gca__alloc_segment_size(rounded) : rounded;
  if (GCA_UNLIKELY(pool->no_split))
    seg_size = no_split_segment_size(rounded);
  if (GCA_LIKELY(d->caching))
    b = pool_take_fit(d, pool, stream, rounded);
  if (b == NULL) {
    /* a capture may be under way: segment calls must not invalidate it (PyTorch's
     * cudaMallocMaybeCapturing) */
    gca_capture_mode_t mode = GCA_CAPTURE_MODE_RELAXED;
    bool relaxed =
        GCA_UNLIKELY(d->ncaptures != 0) && d->ops->thread_exchange_capture_mode(&mode) == GCA_OK;
    if (GCA_UNLIKELY(gc_enabled(d)))
      GCA_CHECK_GOTO(garbage_collect(d), st, fail);
    st = segment_alloc(d, pool, stream, seg_size, rounded, false, &b);
    if (st == GCA_ERR_OUT_OF_MEMORY) {
      bool released = false;
      gca_status_t rst = release_available(d, pool, stream, rounded, &released);
      if (rst != GCA_OK)
        st = rst;
      else if (released)
        st = segment_alloc(d, pool, stream, seg_size, rounded, false, &b);
    }
    if (st == GCA_ERR_OUT_OF_MEMORY && d->ncaptures == 0) {
      gca_status_t rst = release_cached(d);
      st = rst != GCA_OK ? rst : segment_alloc(d, pool, stream, seg_size, rounded, true, &b);
    }
    if (GCA_UNLIKELY(relaxed))
      (void)d->ops->thread_exchange_capture_mode(&mode);
    if (st == GCA_ERR_OUT_OF_MEMORY && pool->owner == NULL && d->mempools != NULL &&
        (b = gca__mempool_take_on_oom(d, stream, rounded)) != NULL) {
      pool = b->pool;
      st = GCA_OK;
    }
    if (st == GCA_ERR_OUT_OF_MEMORY) {
      DEBUG_CHECK(d);
      oom_fail(d, size, seg_size, stream); /* unlocks */
      return GCA_ERR_OUT_OF_MEMORY;
    }
    if (st != GCA_OK)
      goto fail;
  }
  st = gca__ptrmap_insert(&d->ptrs, b->addr, b);
  if (st != GCA_OK) {
    if (!b->in_tree) {
      b->gc_base = pool->free_calls;
      gca__tree_insert(pool, b);
    }
    goto fail;
  }
  GCA_CHECK_GOTO(block_reserve(d), st, fail_unmap);
  block_activate(d, b, rounded, size);
  if (GCA_UNLIKELY(pool->owner != NULL))
    pool->owner->nactive++;
out:
  gca__history_event(GCA_HA_ALLOC, d->device, b->addr, size, stream);
  DEBUG_CHECK(d);
  gca__mutex_unlock(&d->lock);
  *out = (void *)(uintptr_t)b->addr;
  return GCA_OK;

fail_unmap:
  gca__ptrmap_take(&d->ptrs, b->addr);
  if (!b->in_tree) {
    b->gc_base = pool->free_calls;
    gca__tree_insert(pool, b);
  }
fail:
  gca__history_alloc_failure(d->device, size, stream);
  DEBUG_CHECK(d);
  gca__mutex_unlock(&d->lock);
  return gca__error_prefix(st, "malloc of %zu bytes on device %d", size, d->device);
}

/* gca_malloc_device past its fast path: validation, then the lock. */
static __attribute__((noinline)) gca_status_t malloc_slow(int device, void **ptr, size_t size,
                                                          gca_stream_t stream) {
  gca__devalloc_t *d;
  if (ptr == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "malloc: the output pointer is NULL");
  *ptr = NULL;
  if (size == 0)
    return GCA_OK;
  GCA_CHECK(devalloc_get("malloc", device, &d));
  if (GCA_UNLIKELY(size > GCA__MAX_REQUEST)) {
    gca__history_alloc_failure(device, size, stream);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: %zu bytes requested on device %d is more than any device holds",
                      size, device);
  }
  gca__dev_lock(d);
  return dev_malloc_locked(d, ptr, size, stream);
}

/* Whether the free cache's fast paths may run on device d now (d->lock held):
 * something is cached (for malloc) or may be (for free), nothing is pending,
 * no request is routed to a private pool and no history is recorded, so a
 * hit is the whole operation (Note [Free cache]). */
static inline bool fc_quiet(const gca__devalloc_t *d) {
  return (d->npending | d->ndeferred) == 0 &&
         atomic_load_explicit(&d->routing, memory_order_relaxed) == 0 &&
         atomic_load_explicit(&gca__history_recorders, memory_order_relaxed) == 0;
}

/* The fast paths below (the free cache's hit, an uncontended lock) hold no
 * call but the unlock's wake-up, so they run without saving registers; every
 * other case goes to a function that starts over or continues under the lock. */
GCA_API gca_status_t gca_malloc_device(int device, void **ptr, size_t size, gca_stream_t stream) {
  gca__devalloc_t *d;
  if (GCA_LIKELY(ptr != NULL && size - 1 < GCA__MAX_REQUEST &&
                 (unsigned)device < GCA__MAX_DEVICES &&
                 (d = atomic_load_explicit(&g_devs[device], memory_order_acquire)) != NULL &&
                 gca__mutex_trylock(&d->lock))) {
    if (GCA_LIKELY(d->fc_count != 0 && fc_quiet(d))) {
      size_t rounded = round_request(d, size);
      gca__pool_t *pool = rounded <= GCA__SMALL_SIZE ? &d->small : &d->large;
      gca__block_t *b = fc_take(d, pool, stream, rounded, size, true);
      if (GCA_LIKELY(b != NULL)) {
        DEBUG_CHECK(d);
        *ptr = (void *)(uintptr_t)b->addr;
        gca__mutex_unlock(&d->lock);
        return GCA_OK;
      }
    }
    *ptr = NULL;
    return dev_malloc_locked(d, ptr, size, stream);
  }
  return malloc_slow(device, ptr, size, stream);
}

GCA_API gca_status_t gca_malloc(void **ptr, size_t size, gca_stream_t stream) {
  return gca_malloc_device(t_device, ptr, size, stream);
}

/* ---- free, record_stream, pointer_info ---- */

/* Explains why `addr` is not a live allocation: interior, already freed, or
 * not from gca at all. */
static gca_status_t bad_pointer(const char *op, gca_devptr_t addr) {
  int n = atomic_load(&g_ndevs);
  for (int i = 0; i < n; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    for (gca__pool_t *pool = &d->small; pool != NULL; pool = gca__pool_next(d, pool)) {
      for (gca__segment_t *s = pool->segments; s != NULL; s = s->next) {
        if (addr < s->base || addr >= s->base + (s->expandable ? s->reserved_size : s->size))
          continue;
        gca__block_t *b = s->head;
        while (b->next != NULL && b->next->addr <= addr)
          b = b->next;
        gca_devptr_t start = b->addr;
        size_t size = b->size;
        bool live = b->allocated;
        gca__mutex_unlock(&d->lock);
        if (live)
          return gca__error(GCA_ERR_INVALID_POINTER,
                            "%s: pointer 0x%" PRIx64 " is inside the live block at 0x%" PRIx64
                            " (%zu bytes) on device %d, not its start",
                            op, addr, start, size, i);
        if (start == addr)
          return gca__error(GCA_ERR_INVALID_POINTER,
                            "%s: pointer 0x%" PRIx64 " (device %d) is not live: already freed "
                            "(double free?)",
                            op, addr, i);
        return gca__error(GCA_ERR_INVALID_POINTER,
                          "%s: pointer 0x%" PRIx64 " (device %d) is not live: it lies inside "
                          "free memory at 0x%" PRIx64 " (already freed?)",
                          op, addr, i, start);
      }
    }
    gca__mutex_unlock(&d->lock);
  }
  return gca__error(GCA_ERR_INVALID_POINTER,
                    "%s: pointer 0x%" PRIx64 " was not allocated by gca (or was already freed "
                    "and its memory returned)",
                    op, addr);
}

/* Finds the live block at addr and returns with its device's lock held, or
 * NULL (no lock held). A block in the free cache is not live. */
static gca__block_t *lock_live(gca_devptr_t addr, gca__devalloc_t **out) {
  int dev = atomic_load_explicit(&g_single_dev, memory_order_relaxed);
  int first = dev, last = dev;
  if (dev < 0) {
    dev = gca__owner_device(addr);
    if (dev == -1)
      return NULL;
    first = last = dev;
    if (dev == GCA__OWNER_ANY) {
      first = 0;
      last = atomic_load(&g_ndevs) - 1;
    }
  }
  for (int i = first; i <= last; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    gca__block_t *b = gca__ptrmap_find(&d->ptrs, addr);
    if (GCA_LIKELY(b != NULL && !b->cached)) {
      *out = d;
      return b;
    }
    gca__mutex_unlock(&d->lock);
  }
  return NULL;
}

static gca_status_t dev_free(gca__devalloc_t *d, gca__block_t *b) {
  gca__pool_t *pool = b->pool;
  if (b->nuses != 0) {
    if (GCA_UNLIKELY(d->ncaptures != 0)) {
      GCA_CHECK(defer_free(d, b));
    } else if (d->caching) {
      GCA_CHECK(block_insert_events(d, b));
    } else {
      for (uint32_t i = 0; i < b->nuses; i++) {
        gca_status_t st = use_op(d, &b->uses[i], NULL);
        if (st != GCA_OK)
          return gca__error_prefix(st, "free: 0x%" PRIx64, b->addr);
      }
      b->nuses = 0;
    }
  }
  b->allocated = false;
  gca__stat_dec(d->stats.allocation, pool, 1);
  gca__stat_dec(d->stats.allocated_bytes, pool, (int64_t)b->size);
  if (b->oversize)
    gca__stat_add(&d->stats.oversize_allocations, -1);
  b->oversize = false;
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, b->addr, b->requested, b->stream);
  if (b->event_count == 0)
    block_free_complete(d, b, false);
  else
    gca__pend_add(d, pool, 1, b->size);
  return GCA_OK;
}

/* Frees the live block b at addr with d->lock held; returns with it released. */
static __attribute__((noinline)) gca_status_t free_locked(gca__devalloc_t *d, gca__block_t *b,
                                                          gca_devptr_t addr, int expected_dev) {
  gca_status_t st;
  d->epoch++; /* Note [Free cache epochs] */
  if (GCA_UNLIKELY(expected_dev >= 0 && expected_dev != d->device)) {
    gca__mutex_unlock(&d->lock);
    return gca__error(GCA_ERR_INVALID_POINTER,
                      "free: pointer 0x%" PRIx64 " belongs to device %d, not device %d", addr,
                      d->device, expected_dev);
  }
  if (GCA_UNLIKELY(d->npending != 0 || d->ndeferred != 0)) {
    st = process_events(d);
    if (st != GCA_OK) {
      DEBUG_CHECK(d);
      gca__mutex_unlock(&d->lock);
      return st;
    }
  }
  if (fc_try_put(d, b)) {
    DEBUG_CHECK(d);
    gca__mutex_unlock(&d->lock);
    return GCA_OK;
  }
  gca__ptrmap_take(&d->ptrs, addr);
  st = dev_free(d, b);
  if (st != GCA_OK)
    goto fail;
  DEBUG_CHECK(d);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;

fail:
  GCA_ASSERT(gca__ptrmap_insert(&d->ptrs, addr, b) == GCA_OK); /* room is left by the take */
  DEBUG_CHECK(d);
  gca__mutex_unlock(&d->lock);
  return st;
}

/* Frees `ptr`; expected_dev >= 0 also requires it to belong to that device. */
static gca_status_t free_impl(void *ptr, int expected_dev) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  if (ptr == NULL)
    return GCA_OK;
  gca__devalloc_t *d;
  gca__block_t *b = lock_live(addr, &d);
  if (GCA_UNLIKELY(b == NULL))
    return bad_pointer("free", addr);
  return free_locked(d, b, addr, expected_dev);
}

GCA_API gca_status_t gca_free(void *ptr) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  int dev = atomic_load_explicit(&g_single_dev, memory_order_relaxed);
  gca__devalloc_t *d;
  /* one device (the common case): its map is the only place to look */
  if (GCA_LIKELY(dev >= 0 && addr != 0 &&
                 (d = atomic_load_explicit(&g_devs[dev], memory_order_acquire)) != NULL &&
                 gca__mutex_trylock(&d->lock))) {
    gca__block_t *b = gca__ptrmap_find(&d->ptrs, addr);
    if (GCA_LIKELY(b != NULL && !b->cached)) {
      /* the free cache's put: a plain free into its bin (Note [Free cache]) */
      if (GCA_LIKELY(fc_cacheable(d, b) && fc_quiet(d))) {
        gca__fcbin_t *bin = fc_bin(d, b->stream, b->size);
        if (GCA_LIKELY(fc_fits(d, bin, b))) {
          fc_put(d, bin, b);
          DEBUG_CHECK(d);
          gca__mutex_unlock(&d->lock);
          return GCA_OK;
        }
      }
      return free_locked(d, b, addr, -1);
    }
    gca__mutex_unlock(&d->lock);
  }
  return free_impl(ptr, -1);
}

/* The device is resolved now: a stream of another device gets its event
 * there at free time, and NULL means the legacy stream of the caller's
 * current device, wherever the free happens. */
GCA_API gca_status_t gca_record_stream(void *ptr, gca_stream_t stream) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  gca_status_t st = GCA_OK;
  gca__devalloc_t *d;
  gca__block_t *b = lock_live(addr, &d);
  if (b == NULL)
    return bad_pointer("record_stream", addr);
  /* a non-NULL handle names one stream: known ones need no device query */
  if (stream != NULL && stream == b->stream)
    goto out;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (stream != NULL && b->uses[i].stream == stream)
      goto out;
  int sdev;
  st = d->ops->stream_get_device(stream, &sdev);
  if (st != GCA_OK) {
    st = gca__error_prefix(st, "record_stream: 0x%" PRIx64 " on stream %p", addr, (void *)stream);
    goto out;
  }
  if (stream == NULL && b->stream == NULL && sdev == d->device)
    goto out;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (b->uses[i].stream == stream && b->uses[i].dev == sdev)
      goto out;
  if (b->nuses == b->cap_uses) {
    uint32_t ncap = b->cap_uses ? b->cap_uses * 2 : 4;
    gca__use_t *n = realloc(b->uses, ncap * sizeof(*n));
    if (n == NULL) {
      st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "record_stream: host out of memory recording a stream for 0x%" PRIx64, addr);
      goto out;
    }
    b->uses = n;
    b->cap_uses = ncap;
  }
  b->uses[b->nuses++] = (gca__use_t){stream, sdev};
out:
  gca__mutex_unlock(&d->lock);
  return st;
}

GCA_API gca_status_t gca_pointer_info(const void *ptr, size_t *block_size, int *device) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  gca__devalloc_t *d;
  gca__block_t *b = lock_live(addr, &d);
  if (b == NULL)
    return bad_pointer("pointer_info", addr);
  size_t size = b->size;
  int dev = d->device;
  gca__mutex_unlock(&d->lock);
  if (block_size != NULL)
    *block_size = size;
  if (device != NULL)
    *device = dev;
  return GCA_OK;
}

/* ---- devices, cache, limits ---- */

GCA_API gca_status_t gca_set_device(int device) {
  const gca_device_ops_t *ops;
  GCA_CHECK(check_device_index("set_device", device, &ops));
  if (!t_device_told || device != t_device) {
    gca_status_t st = ops->ctx_set_device(device);
    if (st != GCA_OK)
      return gca__error_prefix(st, "set_device");
    t_device_told = true;
  }
  t_device = device;
  return GCA_OK;
}

GCA_API gca_status_t gca_get_device(int *device) {
  if (device == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_device: the output pointer is NULL");
  *device = t_device;
  return GCA_OK;
}

GCA_API gca_status_t gca_empty_cache(void) {
  int n = atomic_load(&g_ndevs);
  for (int i = 0; i < n; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    gca_status_t st = release_cached(d);
    DEBUG_CHECK(d);
    gca__mutex_unlock(&d->lock);
    if (st != GCA_OK)
      return gca__error_prefix(st, "empty_cache: device %d", i);
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_set_memory_fraction(int device, double fraction) {
  gca__devalloc_t *d;
  if (!(fraction > 0.0 && fraction <= 1.0))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "set_memory_fraction: fraction %g is not in (0, 1]",
                      fraction);
  GCA_CHECK(devalloc_get("set_memory_fraction", device, &d));
  gca__dev_lock(d);
  d->set_fraction = true;
  d->allowed_max = (size_t)(fraction * (double)d->total_memory);
  fc_update(d);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

GCA_API gca_status_t gca_enable_peer_access(int device, int peer) {
  gca__devalloc_t *d;
  GCA_CHECK(check_device_index("enable_peer_access", peer, NULL));
  if (peer == device) /* as cuCtxEnablePeerAccess with the current context */
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "enable_peer_access: device %d is not a peer of itself", device);
  GCA_CHECK(devalloc_get("enable_peer_access", device, &d));
  /* classic memory: peer's context gets device's (cudaDeviceEnablePeerAccess) */
  gca_status_t st = d->ops->ctx_enable_peer_access(peer, device);
  if (st != GCA_OK && st != GCA_ERR_INVALID_STATE) /* INVALID_STATE: already enabled */
    return gca__error_prefix(st, "enable_peer_access: device %d to device %d", peer, device);
  gca__dev_lock(d);
  st = gca__expand_add_peer(d, peer);
  gca__mutex_unlock(&d->lock);
  return st;
}

GCA_API gca_status_t gca_set_memory_limit(int device, uint64_t bytes) {
  gca__devalloc_t *d;
  GCA_CHECK(devalloc_get("set_memory_limit", device, &d));
  gca__dev_lock(d);
  d->set_fraction = bytes != 0;
  d->allowed_max = bytes;
  fc_update(d);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

/* ---- settings ---- */

GCA_API gca_status_t gca_set_config(const char *conf) {
  gca_status_t st = GCA_OK;
  if (conf == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "set_config: the configuration string is NULL");
  pthread_mutex_lock(&g_lock);
  if (config_load_locked() != GCA_OK) {
    /* a bad environment setting must not stop the program from setting its own */
    GCA_LOG_WARN("set_config: ignoring the environment's settings: %s", gca_last_error());
    gca__config_defaults(&g_cfg);
    g_cfg_loaded = true;
  }
  gca_alloc_config_t cfg = g_cfg;
  GCA_CHECK_GOTO(gca__config_parse(conf, &cfg), st, out);
  g_cfg = cfg;
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    set_config_locked(d, &cfg);
    apply_limit_from_config(d);
    fc_update(d);
    gca__mutex_unlock(&d->lock);
  }
out:
  pthread_mutex_unlock(&g_lock);
  return st;
}

GCA_API gca_status_t gca_get_config(char *buf, size_t len) {
  gca_status_t st = GCA_OK;
  if (buf == NULL || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_config: no output buffer");
  pthread_mutex_lock(&g_lock);
  st = config_load_locked();
  if (st == GCA_OK)
    st = gca__config_format(&g_cfg, buf, len);
  pthread_mutex_unlock(&g_lock);
  return st;
}

void gca__allocator_get_config(struct gca_alloc_config *out) {
  pthread_mutex_lock(&g_lock);
  if (config_load_locked() != GCA_OK)
    gca__config_defaults(out);
  else
    *out = g_cfg;
  pthread_mutex_unlock(&g_lock);
}

GCA_API gca_status_t gca_set_caching(bool enabled) {
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&g_lock);
  st = config_load_locked();
  if (st == GCA_OK)
    g_caching = enabled;
  pthread_mutex_unlock(&g_lock);
  GCA_CHECK(st);
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    d->caching = enabled;
    fc_update(d);
    if (!enabled)
      st = release_cached(d);
    gca__mutex_unlock(&d->lock);
    if (st != GCA_OK)
      return gca__error_prefix(st, "set_caching: device %d", i);
  }
  return GCA_OK;
}

/* ---- statistics ---- */

GCA_API gca_status_t gca_get_stats(int device, gca_stats_t *out) {
  gca__devalloc_t *d;
  if (out == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_stats: the output pointer is NULL");
  GCA_CHECK(devalloc_get("get_stats", device, &d));
  gca__dev_lock(d);
  gca__stats_read(d, out);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

static void reset_peak(gca_stat_t *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    s[i].peak = s[i].current;
}

static void reset_accum(gca_stat_t *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    s[i].allocated = s[i].freed = 0;
}

#define FOR_EACH_STAT_ARRAY(X, st)              \
  X((st).allocation, GCA_STAT_TYPES);           \
  X((st).segment, GCA_STAT_TYPES);              \
  X((st).active, GCA_STAT_TYPES);               \
  X((st).inactive_split, GCA_STAT_TYPES);       \
  X((st).allocated_bytes, GCA_STAT_TYPES);      \
  X((st).reserved_bytes, GCA_STAT_TYPES);       \
  X((st).active_bytes, GCA_STAT_TYPES);         \
  X((st).inactive_split_bytes, GCA_STAT_TYPES); \
  X((st).requested_bytes, GCA_STAT_TYPES);      \
  X(&(st).oversize_allocations, 1);             \
  X(&(st).oversize_segments, 1)

GCA_API gca_status_t gca_reset_peak_stats(int device) {
  gca__devalloc_t *d;
  GCA_CHECK(devalloc_get("reset_peak_stats", device, &d));
  gca__dev_lock(d);
  FOR_EACH_STAT_ARRAY(reset_peak, d->stats);
  for (int t = 0; t < GCA_STAT_TYPES; t++) { /* Note [Active statistics] */
    d->pend[t].peak = d->stats.allocation[t].current + d->pend[t].current;
    d->pend_bytes[t].peak = d->stats.allocated_bytes[t].current + d->pend_bytes[t].current;
  }
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

GCA_API gca_status_t gca_reset_accumulated_stats(int device) {
  gca__devalloc_t *d;
  GCA_CHECK(devalloc_get("reset_accumulated_stats", device, &d));
  gca__dev_lock(d);
  FOR_EACH_STAT_ARRAY(reset_accum, d->stats);
  for (int t = 0; t < GCA_STAT_TYPES; t++) { /* Note [Active statistics] */
    d->pend[t].base = d->pend[t].current;
    d->pend_bytes[t].base = d->pend_bytes[t].current;
  }
  d->stats.num_alloc_retries = 0;
  d->stats.num_ooms = 0;
  d->stats.num_sync_all_streams = 0;
  d->stats.num_device_alloc = 0;
  d->stats.num_device_free = 0;
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

/* ---- out of memory observers ---- */

GCA_API gca_status_t gca_register_oom_observer(gca_oom_observer_t fn, void *ctx) {
  gca_status_t st = GCA_OK;
  if (fn == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "register_oom_observer: the function is NULL");
  pthread_mutex_lock(&g_lock);
  if (g_nobservers == MAX_OBSERVERS)
    st = gca__error(GCA_ERR_INVALID_STATE, "register_oom_observer: all %d observer slots are taken",
                    MAX_OBSERVERS);
  else
    g_observers[g_nobservers++] = (observer_t){fn, ctx};
  pthread_mutex_unlock(&g_lock);
  return st;
}

/* ---- PyTorch pluggable allocator entry points ---- */

GCA_API void *gca_torch_malloc(ssize_t size, int device, gca_stream_t stream) {
  void *p = NULL;
  gca_status_t st;
  if (size < 0)
    st = gca__error(GCA_ERR_INVALID_ARGUMENT, "torch_malloc: negative size %zd", size);
  else
    st = gca_malloc_device(device, &p, (size_t)size, stream);
  if (st != GCA_OK) {
    GCA_LOG_ERR("%s", gca_last_error());
    return NULL;
  }
  return p;
}

GCA_API void gca_torch_free(void *ptr, ssize_t size, int device, gca_stream_t stream) {
  GCA_UNUSED(size);
  GCA_UNUSED(stream);
  if (free_impl(ptr, device) != GCA_OK)
    GCA_LOG_ERR("%s", gca_last_error());
}

/* ---- introspection support ---- */

int gca__allocator_device_count(void) {
  return atomic_load(&g_ndevs);
}

static void devalloc_destroy(gca__devalloc_t *d) {
  gca__dev_lock(d);
  for (size_t i = 0; i < d->npending; i++) {
    (void)d->ops->event_synchronize(d->pending[i].event);
    (void)d->ops->event_destroy(d->pending[i].event);
  }
  for (int dev = 0; dev < GCA__MAX_DEVICES; dev++) {
    for (size_t i = 0; i < d->events[dev].n; i++)
      (void)d->ops->event_destroy(d->events[dev].ev[i]);
    free(d->events[dev].ev);
  }
  gca__ptrmap_destroy(&d->ptrs);
  gca__mempools_destroy_locked(d);
  gca__pool_t *pools[2] = {&d->small, &d->large};
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments, *next; s != NULL; s = next) {
      next = s->next;
      for (gca__block_t *b = s->head; b != NULL; b = b->next)
        free(b->uses);
      if (s->expandable) {
        gca__expand_destroy(d, s);
      } else {
        (void)segment_memory_free(d, s, false);
        gca__owner_remove(s->base, s->size, d->device);
      }
      free(s);
    }
  }
  for (size_t i = 0; i < d->nslabs; i++)
    free(d->slabs[i]);
  free(d->slabs);
  free(d->pending);
  gca__mutex_unlock(&d->lock);
  free(d);
}

void gca__allocator_reset(void) {
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    atomic_store(&g_devs[i], NULL);
    devalloc_destroy(d);
  }
  atomic_store(&g_single_dev, -1);
  atomic_store(&g_ndevs, 0);
  g_cfg_loaded = false;
  g_caching = true;
  g_nobservers = 0;
  const gca_device_ops_t *ops = gca__device();
  if (t_device_told && t_device != 0 && ops != NULL)
    (void)ops->ctx_set_device(0);
  t_device = 0;
  t_device_told = false;
  pthread_mutex_unlock(&g_lock);
}

/* ---- for pool.c and checkpoint.c ---- */

gca_status_t gca__segment_release(gca__devalloc_t *d, gca__segment_t *seg) {
  return segment_release(d, seg);
}

gca_status_t gca__segment_memory_free(gca__devalloc_t *d, gca__segment_t *seg) {
  return segment_memory_free(d, seg, false);
}

gca__block_t *gca__pool_take_fit(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                 size_t rounded) {
  return pool_take_fit(d, pool, stream, rounded);
}

gca_status_t gca__alloc_sync_pending(gca__devalloc_t *d) {
  return sync_pending(d);
}

gca_status_t gca__alloc_flush_deferred(gca__devalloc_t *d) {
  while (d->ndeferred > 0) {
    gca__block_t *b = d->deferred[d->ndeferred - 1];
    b->event_count = 0;
    gca_status_t st = block_insert_events(d, b);
    if (st != GCA_OK) {
      b->event_count = 1;
      return st;
    }
    d->ndeferred--;
    if (b->event_count == 0)
      block_free_complete(d, b, true);
  }
  return GCA_OK;
}
