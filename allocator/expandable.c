/* SPDX-License-Identifier: Apache-2.0 */
/* expandable.c - expandable segments: per (device, stream, pool) one range of
 * address space, reserved once, with physical memory mapped into it as the
 * pool grows and unmapped again when the cache is released.
 *
 * The one idea: a request that no cached block serves extends the address
 * space that is already there instead of starting a new segment, so memory
 * freed at the end of a segment, or in a hole that was unmapped, is reused
 * at any size and the pool's footprint follows live memory closely.
 *
 * Note [Expandable segments]. The blocks of an expandable segment tile its
 * whole reservation; a block is either mapped (allocated, pending, or free in
 * the pool's tree, exactly as in a classic segment) or unmapped (address space
 * only). A request first takes the best cached fit; failing that, the best
 * candidate is an unmapped block together with the free blocks on either side
 * of it (free + unmapped + free): the one that maps the fewest bytes, and of
 * those the smallest total, so holes fill before the tail grows: a free 6 MiB
 * block at the frontier and a 10 MiB request map 4 MiB more. In the device's
 * own pools a hole maps at its end when the free block after it lacks less
 * than the one before it (grow_len): a 10 MiB hole before a free 10 MiB
 * block maps 4 MiB for a 14 MiB request, not all 10.
 *
 * Physical memory is the scarce thing, address space is not. So in the
 * device's own pools growth maps exactly what the request lacks, rounded up to
 * the driver's granularity, and every granule is its own handle: any granule
 * wholly inside a free block can be unmapped, whatever lives next to it, and
 * the memory that stays mapped beyond live blocks is less than two granules
 * per free block. With expandable_moves:True (gca's key, on by default: see
 * the trade-off below), before a growth would create handles while free
 * blocks elsewhere in the segment (or in the pool's other segments: Note
 * [Moves across segments]) hold whole granules (fragmentation) and the
 * device's reserved memory would pass peak live memory by more than 0.4%
 * (Note [Moves within a bound]), it moves those handles instead: held frees
 * (the free cache, the recycle bins) go back to the tree, the free granules
 * are taken out of it as a release batch and "parked", and the growth maps
 * the parked handles where the request needs them (gca__expand_take_donors,
 * gca__expand_unpark; release.c's move_handles). A granule that no work
 * queued on its stream can still use (Note [Move horizons], horizon.c: known
 * without waiting) is unmapped at once; one of the growing stream's segments
 * that queued work may still use is lent, mapped at both places until the
 * stream has passed it (Note [Lent granules]); one of another stream's
 * segment is taken only out of memory, after the batch synchronizes its
 * stream with the lock let go (Note [No waits under the device lock]; a
 * capturing stream is never synchronized). The growth maps the hole the
 * moves were taken for, not one they opened (planned_hole). Data of live
 * blocks never moves; only free granules do, so a live block's bytes stay
 * where they are. Nothing moves while a capture is under way (d->ncaptures):
 * a growth then creates as before.
 *
 * Private pools (graph pools, comm pools, Note [Checkpoints]) keep one handle
 * per growth, of at least the pool's step (2 MiB small, the classic segment
 * size for large requests): their free ranges may be used by graph replays and
 * their mappings are recorded by checkpoints and registrations, so nothing is
 * moved out of them and small handles would only cost calls.
 *
 * The trade-off, in driver calls: a growth of n granules costs n mem_create +
 * n mem_map + one mem_set_access (over the whole range, as PyTorch opens its
 * handles), about 1,025 calls per GiB where one 20 MiB handle per step costs
 * about 150 and a classic segment one mem_alloc; a move costs a mem_map per
 * granule, a mem_unmap per run of adjacent granules taken (the driver unmaps
 * several whole mappings in one call; a lent run's unmap comes later) and, per
 * donor segment, a stream_query or an event_record and event_query (Note [Move
 * horizons]); a release, a mem_release per granule and a mem_unmap per run;
 * an IPC export, one handle per granule. In exchange, peak mapped memory stays
 * within 0.4% of peak live memory (the bound), plus the granule rounding of
 * each growth and the sub-granule ends of free blocks. Moves are paid again on
 * every iteration of a loop whose frees fragment the segment the same way each
 * time. Measured with gca-replay's warm passes on the KV-cache serving traces
 * of gca-trace-gen, seeds 1-3, 80 GiB: peak mapped / peak live 1.0039, 1.0039
 * and 1.0038 with moves, 1.1006, 1.0849 and 1.0751 without; 20,100 / 15,500 /
 * 5,400 driver calls per pass with moves, none without. With the streams
 * 1,000 events behind the host (gca-replay --lag 1000: the freed memory still
 * in use by queued work), 1.0034 / 1.0037 / 1.0038 at 34,300 / 22,500 / 9,900
 * calls per pass, and no host stall (Note [Lent granules]). On an H200
 * (driver 580) the moves cost 12.8 / 11.7 / 4.0 us per event against 0.1 us
 * without; that time is per granule moved, not per call (one unmap per run
 * instead of per granule halved the calls and left it unchanged): a map,
 * set_access and unmap of one 2 MiB granule took 50 us, 48 us each for four in
 * one set_access and one unmap. transformer-train-a: 1.0018 with, 78-100 calls
 * per warm pass (gca-replay --repeat 3 / 2), 1.0019 without. None of the VMM calls waits for work
 * queued on the device (contract_mem's vmm_calls_do_not_wait_for_work_queued_on_the_device, run on
 * the H200), and a move waits for no stream (Note [Move horizons]), so the price of moves is the
 * host time of those calls. Moves are on by default, gca's own key beside PyTorch's
 * expandable_segments (which maps only to grow): expandable segments are asked for to keep memory
 * that fragmentation would waste, and without moves a loop that fragments the same way each
 * iteration keeps up to 10% of it on the serving traces (an engine whose host runs ahead of its GPU
 * hides the calls). One that needs a steady state free of driver calls sets expandable_moves:False
 * and still gets granule-sized handles that release can give back, and moves once the device is out
 * of memory (Note [Moves on out of memory], release.c): capped at 1.005 x peak live memory the
 * three serving traces ran with no failed request at 19,400 / 15,100 / 6,200 driver calls per warm
 * pass (on the H200, capped by per_process_memory_fraction: 1.0050 / 1.0049 / 1.0046, 17,500 /
 * 15,100 / 5,500 calls, 12.9 / 12.6 / 3.7 us per event; at 1.0007 x, still no failed request).
 * Other donor orders did not pay: taking the granules free the longest first, the smallest free
 * ranges first or the largest first took more calls; the highest addresses first took up to 5%
 * fewer on two traces, 10% more on the third; the donors here go in address order. What moves
 * cannot take is the sub-granule ends of the free blocks that lie between
 * live ones at the peak: those granules stay mapped. stats.num_driver_calls,
 * grown_bytes and num_handle_moves count it (gca-replay reports driver calls
 * per GiB grown).
 *
 * Release (empty_cache, the out-of-memory retry, garbage collection) unmaps
 * every mapping that lies entirely inside a free block and keeps one that a
 * live block still touches. Unmapping waits for the segment's own stream
 * (stream_synchronize), never the whole device. The driver steps (granularity,
 * access list, create + map + set_access, unmap + release) are vmm.c's, shared
 * with VMM-backed classic segments.
 *
 * Statistics follow PyTorch's expandable segments: reserved_bytes counts
 * mapped bytes, num_device_alloc counts growths and num_device_free handles
 * released, the segment count leaves expandable segments out, and history
 * records segment_map per growth and segment_unmap per handle; observers hear
 * of every handle (one registration per physical allocation).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"
#include "expandable.h"
#include "history.h"

static inline size_t round_up(size_t x, size_t g) {
  return (x + g - 1) / g * g;
}

/* Adds (sign 1) or removes (-1) a free block's share of inactive_split, by
 * blocks.c's rule: a free block counts unless it is alone in its segment. */
static void split_account(gca__devalloc_t *d, const gca__block_t *b, int sign) {
  if (b->prev == NULL && b->next == NULL)
    return;
  gca__stat_pool(d, d->stats.inactive_split, b->pool, sign);
  gca__stat_pool(d, d->stats.inactive_split_bytes, b->pool, sign * (int64_t)b->size);
}

static inline bool is_free(const gca__block_t *b) {
  return b != NULL && b->in_tree;
}

/* Whether b is a hole a growth may map: unmapped and not lent (Note [Lent
 * granules]: still mapped in the driver). */
static inline bool is_hole(const gca__block_t *b) {
  return b != NULL && b->unmapped && !gca__block_lent(b);
}

/* ---- mappings (their driver steps: vmm.c) ---- */

/* Records hs[0, k), mapped at base + off one granule (g) each, as mappings
 * of seg, with the statistics and history of a growth. */
static void record_maps(gca__devalloc_t *d, gca__segment_t *seg, size_t off, size_t g, size_t k,
                        const gca_memhandle_t *hs, size_t moved) {
  size_t i = seg->nmaps, len = k * g;
  while (i > 0 && seg->maps[i - 1].offset > off)
    i--;
  memmove(&seg->maps[i + k], &seg->maps[i], (seg->nmaps - i) * sizeof(seg->maps[0]));
  for (size_t j = 0; j < k; j++)
    seg->maps[i + j] = (gca__mapping_t){off + j * g, g, hs[j]};
  seg->nmaps += k;
  seg->size += len;
  d->reserved += len;
  gca__stat_pool(d, d->stats.reserved_bytes, seg->pool, (int64_t)len);
  d->stats.num_device_alloc++;
  d->stats.num_handle_moves += (int64_t)moved;
  gca__history_event(GCA_HA_SEGMENT_MAP, d->device, seg->base + off, len, seg->stream);
}

/* Maps [base + off, + len) of seg with one handle per granule (private pools:
 * one handle): parked handles first (a move), new ones for the rest; one
 * set_access for the range, one history event and num_device_alloc; observers
 * hear of each handle. On failure the growth is undone, last granule first:
 * new handles released, moved ones parked again. Should an unmap of that undo
 * fail too, the granules below it stay mapped and are recorded (opened to the
 * access list and announced as well as the driver allows): *kept says how
 * many bytes at the start of the range, so that the caller makes them a free
 * block; nothing is lost either way. */
static gca_status_t map_range(gca__devalloc_t *d, gca__segment_t *seg, size_t off, size_t len,
                              size_t *kept) {
  gca_status_t st = GCA_OK;
  size_t g = seg->pool->owner == NULL ? d->granularity : len, k = len / g, done = 0, moved = 0;
  size_t announced = 0;
  bool opened = false;
  gca_devptr_t ptr = seg->base + off;
  bool keep = d->keep_partial && seg->pool->owner == NULL; /* read under the lock */
  *kept = 0;
  GCA_CHECK(gca__limit_check(d, len, "a mapping"));
  if (seg->nmaps + k > seg->cap_maps) {
    size_t ncap = seg->cap_maps ? seg->cap_maps * 2 : 8;
    while (ncap < seg->nmaps + k)
      ncap *= 2;
    gca__mapping_t *n = GCA_FAILPOINT("expand_maps") ? NULL : realloc(seg->maps, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a mapping record");
    seg->maps = n;
    seg->cap_maps = ncap;
  }
  gca_memhandle_t *hs = GCA_FAILPOINT("expand_handles") ? NULL : malloc(k * sizeof(*hs));
  if (hs == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for %zu handles", k);
  for (; done < k; done++) {
    gca_devptr_t at = ptr + done * g;
    if (seg->nparked > 0) {
      st = gca__vmm_map_only(d, at, g, seg->parked[seg->nparked - 1]);
      if (st != GCA_OK)
        break;
      hs[done] = seg->parked[--seg->nparked];
      moved++;
    } else if ((st = gca__vmm_create_map(d, at, g, &hs[done])) != GCA_OK) {
      break;
    }
  }
  if (st == GCA_OK)
    opened = (st = gca__vmm_set_access(d, ptr, len)) == GCA_OK;
  for (; st == GCA_OK && announced < k; announced++) {
    st = gca__observe(seg->pool, GCA_SEGMENT_MAPPED, ptr + announced * g, g);
    if (st != GCA_OK)
      break;
  }
  if (st == GCA_OK) {
    record_maps(d, seg, off, g, k, hs, moved);
    free(hs);
    return GCA_OK;
  }
  st = gca__error_prefix(st,
                         "malloc: mapping %zu bytes at 0x%" PRIx64
                         " of an expandable segment (%zu of %zu granules mapped, %zu moved)",
                         len, ptr, done, k, moved);
  char why[1024]; /* the undo's own failures must not replace it */
  snprintf(why, sizeof(why), "%s", gca_last_error());
  /* the granules created before the device ran out of memory stay, opened
   * (d->keep_partial, Note [Moves on out of memory]; a default pool's growth:
   * no observer); should that fail, the growth is undone as any other */
  if (keep && st == GCA_ERR_OUT_OF_MEMORY && moved == 0 && done > 0 &&
      gca__vmm_set_access(d, ptr, done * g) == GCA_OK) {
    record_maps(d, seg, off, g, done, hs, 0);
    *kept = done * g;
    free(hs);
    return gca__error(st, "%s", why);
  }
  size_t j = done;
  for (; j > 0; j--) { /* moved ones are the first: they park again last-in first-out */
    gca_devptr_t at = ptr + (j - 1) * g;
    if (j - 1 < announced)
      GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_UNMAPPING, at, g));
    if (gca__vmm_unmap_keep(d, at, g) != GCA_OK) {
      GCA_LOG_WARN("malloc: undoing a growth: %s (the range stays mapped and cached)",
                   gca_last_error());
      if (j - 1 < announced)
        GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_MAPPED, at, g));
      break;
    }
    if (j - 1 < moved)
      seg->parked[seg->nparked++] = hs[j - 1];
    else
      gca__vmm_release_handle(d, hs[j - 1]);
  }
  if (j > 0) { /* granules [0, j) could not be unmapped: keep them */
    if (!opened)
      GCA_CHECK_IGNORE(gca__vmm_set_access(d, ptr, j * g));
    for (size_t x = announced; x < j; x++)
      GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_MAPPED, ptr + x * g, g));
    record_maps(d, seg, off, g, j, hs, moved < j ? moved : j);
    *kept = j * g;
  }
  free(hs);
  return gca__error(st, "%s", why);
}

/* Unmaps mappings [i, j) of seg (adjacent: one range) with one mem_unmap
 * (the driver unmaps several whole mappings in one call; Note [Sim whole
 * mappings]), and releases their handles, last first, or parks them while the
 * segment wants handles parked (a move). Each handle is one observer call,
 * history event and num_device_free (a moved one none: its memory stays in
 * use). *from: the index of the first mapping unmapped (j when none); those
 * at [*from, j) are gone from maps[] on return. A failed unmap keeps the whole
 * run mapped; a failed release leaves its range unmapped and forgotten (the
 * status says so). */
static gca_status_t unmap_run(gca__devalloc_t *d, gca__segment_t *seg, size_t i, size_t j,
                              size_t *from, bool lend) {
  size_t k = j;
  gca_status_t st = GCA_OK, rst = GCA_OK;
  gca_devptr_t lo = seg->base + seg->maps[i].offset;
  size_t len = seg->maps[j - 1].offset + seg->maps[j - 1].size - seg->maps[i].offset;
  for (size_t m = i; m < j; m++)
    GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_UNMAPPING, seg->base + seg->maps[m].offset,
                                  seg->maps[m].size));
  if (!lend && (st = gca__vmm_unmap_keep(d, lo, len)) != GCA_OK) {
    for (size_t m = i; m < j; m++) /* still there: the observer hears of them again */
      GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_MAPPED, seg->base + seg->maps[m].offset,
                                    seg->maps[m].size));
    *from = j;
    return gca__error_prefix(st, "release of 0x%" PRIx64 " (%zu bytes) of an expandable segment",
                             lo, len);
  }
  while (k > i) {
    gca__mapping_t m = seg->maps[k - 1];
    gca_devptr_t ptr = seg->base + m.offset;
    k--;
    seg->size -= m.size;
    d->reserved -= m.size;
    gca__stat_pool(d, d->stats.reserved_bytes, seg->pool, -(int64_t)m.size);
    gca__history_event(GCA_HA_SEGMENT_UNMAP, d->device, ptr, m.size, seg->stream);
    if (seg->park_want >= m.size) {
      seg->parked[seg->nparked++] = m.handle; /* room made by gca__expand_take_donors */
      seg->park_want -= m.size;
      continue;
    }
    d->stats.num_device_free++;
    __atomic_fetch_add(&d->stats.num_driver_calls, 1, __ATOMIC_RELAXED);
    gca_status_t r = d->ops->mem_release(m.handle);
    if (r != GCA_OK && rst == GCA_OK)
      rst = gca__error_prefix(r, "release of 0x%" PRIx64 " (%zu bytes) of an expandable segment",
                              ptr, m.size);
  }
  *from = k;
  memmove(&seg->maps[k], &seg->maps[j], (seg->nmaps - j) * sizeof(seg->maps[0]));
  seg->nmaps -= j - k;
  return rst;
}

/* ---- segments ---- */

static gca__segment_t *find_segment(gca__pool_t *pool, gca_stream_t stream) {
  for (gca__segment_t *s = pool->segments; s != NULL; s = s->next)
    if (s->expandable && s->stream == stream)
      return s;
  return NULL;
}

/* Reserves twice the device's memory as one unmapped block. PyTorch
 * reserves 1.125x, enough for a segment that only grows at its end; here the
 * holes between live blocks are address space too, and a request that none of
 * them fits is mapped past them: with 1.125x, the serving traces of
 * gca-trace-gen ran out of address space (failed requests) on a device only
 * 1-2% larger than their peak live memory. An H200 (driver 580) gave 467
 * reservations of 2x its memory (831 of 1.125x) before refusing the next. */
static gca_status_t segment_create(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                   gca__segment_t **out) {
  gca_status_t st;
  size_t g;
  gca__block_t *b;
  gca_devptr_t base = 0;
  GCA_CHECK(gca__vmm_granularity(d, &g));
  size_t size = round_up(d->total_memory * 2, g);
  GCA_CHECK(gca__block_new(d, &b));
  gca__segment_t *seg = calloc(1, sizeof(*seg));
  if (seg == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a segment record");
    goto fail_block;
  }
  st = d->ops->mem_address_reserve(d->device, size, 0, &base);
  if (st != GCA_OK) {
    gca__error_prefix(st, "malloc: reserving %zu bytes for an expandable segment", size);
    /* the out-of-memory report that follows speaks of physical memory: say
     * what ran out (a GPU has about 128 TiB of address space; each segment of
     * each stream and pool reserves twice the device's memory) */
    if (st == GCA_ERR_OUT_OF_MEMORY)
      GCA_LOG_WARN("device %d: no address space left for another expandable segment (%zu "
                   "bytes each, one per stream and pool; segments of destroyed streams keep "
                   "theirs until their memory is released): %s",
                   d->device, size, gca_last_error());
    goto fail_seg;
  }
  GCA_CHECK_GOTO(gca__owner_add(base, size, d->device), st, fail_reserve);
  b->addr = base;
  b->size = size;
  b->stream = stream;
  b->pool = pool;
  b->seg = seg;
  b->unmapped = true;
  seg->base = base;
  seg->reserved_size = size;
  seg->stream = stream;
  seg->pool = pool;
  seg->head = b;
  seg->expandable = true;
  gca__segment_link(pool, seg);
  *out = seg;
  return GCA_OK;

fail_reserve:
  GCA_CHECK_IGNORE(d->ops->mem_address_free(d->device, base, size));
fail_seg:
  free(seg);
fail_block:
  gca__block_free(d, b);
  return st;
}

/* Removes a segment with nothing mapped (one unmapped block) and frees its
 * reservation; on failure it stays as it was. */
static gca_status_t segment_remove(gca__devalloc_t *d, gca__segment_t *seg) {
  gca__pool_t *pool = seg->pool;
  GCA_ASSERT(seg->nmaps == 0 && seg->head->unmapped && seg->head->next == NULL);
  gca_status_t st = d->ops->mem_address_free(d->device, seg->base, seg->reserved_size);
  if (st != GCA_OK)
    return gca__error_prefix(st, "release of expandable segment 0x%" PRIx64, seg->base);
  gca__owner_remove(seg->base, seg->reserved_size, d->device);
  seg->head->unmapped = false;
  gca__block_free(d, seg->head);
  gca__segment_unlink(pool, seg);
  gca__hz_destroy(d, seg);
  free(seg->maps);
  free(seg->parked);
  free(seg);
  return GCA_OK;
}

/* ---- growth ---- */

/* Merges src, the address neighbour of dst, into dst; src's record is freed. */
static void absorb(gca__devalloc_t *d, gca__block_t *dst, gca__block_t *src) {
  if (src == dst->prev) {
    dst->addr = src->addr;
    dst->prev = src->prev;
    if (dst->prev != NULL)
      dst->prev->next = dst;
    else
      dst->seg->head = dst;
  } else {
    dst->next = src->next;
    if (dst->next != NULL)
      dst->next->prev = dst;
  }
  dst->size += src->size;
  if (src->gc_base > dst->gc_base) /* the later free (Note [Move horizons]) */
    dst->gc_base = src->gc_base;
  src->unmapped = false;
  gca__block_free(d, src);
}

/* An unmapped block [addr, + size) of u's segment, from record r (fresh). */
static gca__block_t *unmapped_rest(gca__block_t *r, const gca__block_t *u, gca_devptr_t addr,
                                   size_t size) {
  r->addr = addr;
  r->size = size;
  r->stream = u->stream;
  r->pool = u->pool;
  r->seg = u->seg;
  r->unmapped = true;
  return r;
}

/* Makes hole u the range [lo, + len) inside it, just mapped, with the
 * unmapped rest before and after it blocks of their own, from spare[0] and
 * spare[1] (each set to NULL when used). */
static void split_hole(gca__block_t *u, gca_devptr_t lo, size_t len, gca__block_t **spare) {
  gca__block_t *r;
  if (lo > u->addr) {
    r = unmapped_rest(spare[0], u, u->addr, lo - u->addr);
    spare[0] = NULL;
    r->prev = u->prev;
    r->next = u;
    if (r->prev != NULL)
      r->prev->next = r;
    else
      u->seg->head = r;
    u->prev = r;
  }
  if (lo + len < u->addr + u->size) {
    r = unmapped_rest(spare[1], u, lo + len, u->addr + u->size - lo - len);
    spare[1] = NULL;
    r->prev = u;
    r->next = u->next;
    if (r->next != NULL)
      r->next->prev = r;
    u->next = r;
  }
  u->addr = lo;
  u->size = len;
}

/* The bytes hole u and the free blocks on either side of it hold. */
static size_t hole_total(const gca__block_t *u) {
  return u->size + (is_free(u->prev) ? u->prev->size : 0) + (is_free(u->next) ? u->next->size : 0);
}

/* The bytes of hole u that serving `rounded` maps: what the free block before
 * it lacks, rounded up to the granularity, mapped at u's start; or, in the
 * device's own pools, what the free block after it lacks, mapped at u's end
 * (*right), when that is less; all of u when both free blocks are needed. */
static size_t grow_len(const gca__block_t *u, size_t rounded, size_t g, bool *right) {
  size_t psz = is_free(u->prev) ? u->prev->size : 0;
  size_t nsz = is_free(u->next) ? u->next->size : 0;
  *right = false;
  if (psz >= rounded)
    return 0;
  size_t len = rounded - psz >= u->size ? u->size : round_up(rounded - psz, g);
  if (u->pool->owner == NULL && nsz > psz) {
    size_t r = nsz >= rounded ? 0 : rounded - nsz >= u->size ? u->size : round_up(rounded - nsz, g);
    if (r < len) {
      *right = true;
      len = r;
    }
  }
  return len;
}

/* The hole that serves `rounded` mapping the fewest bytes, and of those the
 * one with the smallest total; NULL when none serves it. */
static gca__block_t *best_hole(gca__segment_t *seg, size_t rounded, size_t g) {
  gca__block_t *u = NULL;
  size_t best_len = SIZE_MAX, best_total = SIZE_MAX;
  for (gca__block_t *b = seg->head; b != NULL; b = b->next) {
    size_t total = is_hole(b) ? hole_total(b) : 0;
    if (total < rounded)
      continue;
    bool right;
    size_t len = grow_len(b, rounded, g, &right);
    if (len < best_len || (len == best_len && total < best_total)) {
      u = b;
      best_len = len;
      best_total = total;
    }
  }
  return u;
}

/* The hole that the moves parked handles for (gca__expand_take_donors), if it
 * still serves `rounded`. The holes the moves opened come second, even when
 * they would map as little: filling them instead leaves the planned hole to a
 * later growth, which finds fewer donors, and on the serving traces of
 * gca-trace-gen that raised peak mapped memory by up to 0.7%. */
static gca__block_t *planned_hole(gca__segment_t *seg, size_t rounded) {
  if (seg->park_hole == 0)
    return NULL;
  for (gca__block_t *b = seg->head; b != NULL; b = b->next)
    if (b->addr == seg->park_hole)
      return is_hole(b) && hole_total(b) >= rounded ? b : NULL;
  return NULL;
}

gca__segment_t *gca__expand_lent_in_way(gca__pool_t *pool, gca_stream_t stream, size_t rounded) {
  gca__segment_t *seg = find_segment(pool, stream);
  size_t g = pool->dev->granularity;
  if (seg == NULL || g == 0 || gca__hz_aliases(seg) == 0 || best_hole(seg, rounded, g) != NULL)
    return NULL;
  for (gca__block_t *b = seg->head; b != NULL; b = b->next) {
    if (!b->unmapped || (b->prev != NULL && b->prev->unmapped))
      continue; /* not the start of a run of unmapped blocks */
    size_t total = is_free(b->prev) ? b->prev->size : 0;
    bool lent = false;
    gca__block_t *e = b;
    for (; e != NULL && e->unmapped; e = e->next) {
      total += e->size;
      lent = lent || gca__block_lent(e);
    }
    if (is_free(e))
      total += e->size;
    if (lent && total >= rounded)
      return seg;
  }
  return NULL;
}

gca_status_t gca__expand_alloc(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                               size_t rounded, size_t step, gca__block_t **out) {
  gca__segment_t *seg = find_segment(pool, stream);
  gca_status_t st;
  size_t g;

  if (seg == NULL)
    GCA_CHECK(segment_create(d, pool, stream, &seg));
  GCA_CHECK(gca__vmm_granularity(d, &g));
  gca__block_t *u = planned_hole(seg, rounded);
  if (u == NULL)
    u = best_hole(seg, rounded, g);
  if (u == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: the expandable segment at 0x%" PRIx64 " (%zu bytes of address "
                      "space, %zu mapped) has no room for %zu bytes",
                      seg->base, seg->reserved_size, seg->size, rounded);
  gca__block_t *p = is_free(u->prev) ? u->prev : NULL;
  gca__block_t *n = is_free(u->next) ? u->next : NULL;
  size_t psz = p ? p->size : 0;
  bool right;
  size_t len = grow_len(u, rounded, g, &right);
  if (len == 0) {
    /* the cached fit passed p or n over (max_split_size rules): take it as it is */
    gca__block_t *b = right ? n : p;
    gca__tree_erase(pool, b);
    *out = b;
    return GCA_OK;
  }
  if (pool->owner != NULL && len < u->size) { /* private pools grow by steps */
    size_t want = round_up(step > psz ? step - psz : 0, g);
    if (want > len)
      len = want < u->size ? want : u->size;
  }
  size_t kept;
  gca__block_t *spare[2] = {NULL, NULL}; /* the unmapped rests of u, if any */
  GCA_CHECK(gca__block_new(d, &spare[0]));
  st = GCA_FAILPOINT("expand_spare")
           ? gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a block record")
           : gca__block_new(d, &spare[1]);
  if (st != GCA_OK) {
    gca__block_free(d, spare[0]);
    return st;
  }
  gca_devptr_t lo = right ? u->addr + u->size - len : u->addr;
  st = map_range(d, seg, lo - seg->base, len, &kept);
  if (st != GCA_OK && kept != 0) { /* a failed undo left a mapped start: cached below */
    len = kept;
  } else if (st != GCA_OK) {
    gca__block_free(d, spare[0]);
    gca__block_free(d, spare[1]);
    return st;
  }
  if (lo != u->addr)
    p = NULL;
  if (lo + len != u->addr + u->size)
    n = NULL;
  split_hole(u, lo, len, spare);
  for (int i = 0; i < 2; i++)
    if (spare[i] != NULL)
      gca__block_free(d, spare[i]);
  gca__block_t *m = u;
  m->unmapped = false;
  m->gc_base = pool->free_calls;
  if (p != NULL) {
    split_account(d, p, -1);
    gca__tree_erase(pool, p);
    absorb(d, p, m);
    m = p;
  }
  if (n != NULL) {
    split_account(d, n, -1);
    gca__tree_erase(pool, n);
    absorb(d, m, n);
  }
  split_account(d, m, 1);
  if (st != GCA_OK) { /* the kept start of a failed growth: a free block */
    gca__tree_insert(pool, m);
    return st;
  }
  *out = m;
  return GCA_OK;
}

/* ---- release ---- */

/* Merges unmapped block b with the holes beside it. */
static void unmapped_merge(gca__devalloc_t *d, gca__block_t *b) {
  if (is_hole(b->prev))
    absorb(d, b, b->prev);
  if (is_hole(b->next))
    absorb(d, b, b->next);
}

void gca__expand_unlend(gca__devalloc_t *d, gca__block_t *r) {
  r->releasing = false;
  unmapped_merge(d, r);
}

/* Turns [ms, me), the range of a mapping just unmapped inside the free block
 * b, into an unmapped block, with free blocks for what remains of b on either
 * side; spare[] holds two block records, used ones are set to NULL. Returns
 * the block after the new unmapped one, or NULL. */
static gca__block_t *carve(gca__devalloc_t *d, gca__block_t *b, gca_devptr_t ms, gca_devptr_t me,
                           gca__block_t **spare, bool lend, uint64_t stamp) {
  gca__pool_t *pool = b->pool;
  gca__block_t *before = NULL, *after = NULL;
  split_account(d, b, -1);
  gca__tree_erase(pool, b);
  if (ms > b->addr) {
    before = spare[0];
    spare[0] = NULL;
    *before = (gca__block_t){.addr = b->addr,
                             .size = ms - b->addr,
                             .stream = b->stream,
                             .pool = pool,
                             .seg = b->seg,
                             .prev = b->prev,
                             .next = b,
                             .gc_base = b->gc_base};
    if (before->prev != NULL)
      before->prev->next = before;
    else
      b->seg->head = before;
    b->prev = before;
  }
  if (me < b->addr + b->size) {
    after = spare[1];
    spare[1] = NULL;
    *after = (gca__block_t){.addr = me,
                            .size = b->addr + b->size - me,
                            .stream = b->stream,
                            .pool = pool,
                            .seg = b->seg,
                            .prev = b,
                            .next = b->next,
                            .gc_base = b->gc_base};
    if (after->next != NULL)
      after->next->prev = after;
    b->next = after;
  }
  b->addr = ms;
  b->size = me - ms;
  b->unmapped = true;
  b->gc_base = 0;
  if (lend) { /* a range of its own until its driver mapping goes */
    b->releasing = true;
    gca__hz_alias_add(b->seg, b, stamp);
  } else {
    unmapped_merge(d, b);
  }
  if (before != NULL) {
    gca__tree_insert(pool, before);
    split_account(d, before, 1);
  }
  if (after != NULL) {
    gca__tree_insert(pool, after);
    split_account(d, after, 1);
  }
  return b->next;
}

/* Index of the first mapping wholly inside [lo, hi), or nmaps. */
static size_t mapping_inside(const gca__segment_t *seg, size_t lo, size_t hi) {
  size_t a = 0, z = seg->nmaps;
  while (a < z) {
    size_t mid = (a + z) / 2;
    if (seg->maps[mid].offset < lo)
      a = mid + 1;
    else
      z = mid;
  }
  if (a < seg->nmaps && seg->maps[a].offset + seg->maps[a].size <= hi)
    return a;
  return seg->nmaps;
}

/* Unmaps every mapping that lies wholly inside [lo, hi) (offsets into seg) and
 * wholly inside a free block; seg's stream was synchronized (a release batch,
 * Note [No waits under the device lock]). Stops at the first failure, keeping
 * what was released before it. */
static gca_status_t release_in(gca__devalloc_t *d, gca__segment_t *seg, size_t lo, size_t hi,
                               size_t *released, bool lend, uint64_t stamp) {
  gca_status_t st = GCA_OK;
  gca__block_t *spare[2] = {NULL, NULL};
  for (gca__block_t *b = seg->head; b != NULL;) {
    size_t blo = b->addr - seg->base, bhi = blo + b->size;
    size_t clo = blo > lo ? blo : lo, chi = bhi < hi ? bhi : hi;
    if (!b->in_tree || clo >= chi) {
      b = b->next;
      continue;
    }
    size_t i = mapping_inside(seg, clo, chi), j = i;
    while (j < seg->nmaps && seg->maps[j].offset + seg->maps[j].size <= chi)
      j++;
    if (i == j) {
      b = b->next;
      continue;
    }
    for (int k = 0; k < 2; k++)
      if (spare[k] == NULL && (st = gca__block_new(d, &spare[k])) != GCA_OK)
        goto out;
    if (lend && (st = gca__hz_alias_room(seg, 1)) != GCA_OK)
      goto out;
    size_t end = seg->maps[j - 1].offset + seg->maps[j - 1].size, before = seg->size, from;
    gca_status_t ust = unmap_run(d, seg, i, j, &from, lend);
    size_t gone = before - seg->size;
    if (gone == 0) {
      st = ust; /* still mapped: nothing changed */
      goto out;
    }
    if (released != NULL && !lend)
      *released += gone;
    b = carve(d, b, seg->base + end - gone, seg->base + end, spare, lend, stamp);
    if (ust != GCA_OK) {
      st = ust;
      goto out;
    }
  }
out:
  for (int k = 0; k < 2; k++)
    if (spare[k] != NULL)
      gca__block_free(d, spare[k]);
  return st;
}

size_t gca__expand_mapped_inside(const gca__segment_t *seg, size_t lo, size_t hi) {
  size_t bytes = 0;
  for (size_t i = mapping_inside(seg, lo, hi);
       i < seg->nmaps && seg->maps[i].offset + seg->maps[i].size <= hi; i++)
    bytes += seg->maps[i].size;
  return bytes;
}

/* Whether free block b holds a whole mapping of seg; its mapped bytes in *bytes. */
static bool holds_mapping(const gca__segment_t *seg, const gca__block_t *b, size_t *bytes) {
  *bytes = gca__expand_mapped_inside(seg, b->addr - seg->base, b->addr - seg->base + b->size);
  return *bytes != 0;
}

gca_status_t gca__expand_take(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg) {
  (void)d;
  size_t n = 0, bytes;
  for (gca__block_t *b = seg->head; b != NULL; b = b->next)
    n += b->in_tree && holds_mapping(seg, b, &bytes);
  size_t lent = gca__hz_aliases(seg) != 0; /* a wait that lets them go, first */
  if (n + lent == 0)
    return GCA_OK;
  GCA_CHECK(gca__relbatch_room(bt, n + lent));
  if (lent)
    bt->v[bt->n++] = (gca__relent_t){.seg = seg, .expandable = true};
  for (gca__block_t *b = seg->head; b != NULL; b = b->next)
    if (b->in_tree && holds_mapping(seg, b, &bytes))
      gca__relbatch_add(bt, seg, b, bytes);
  return GCA_OK;
}

gca_status_t gca__expand_take_range(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg,
                                    size_t lo, size_t hi) {
  (void)d;
  size_t n = 0;
  for (int pass = 0; pass < 2; pass++) { /* count, make room, then take */
    if (pass == 1) {
      if (n == 0)
        return GCA_OK;
      GCA_CHECK(gca__relbatch_room(bt, n));
    }
    for (gca__block_t *b = seg->head, *next; b != NULL; b = next) {
      next = b->next;
      size_t blo = b->addr - seg->base, bhi = blo + b->size;
      size_t clo = blo > lo ? blo : lo, chi = bhi < hi ? bhi : hi;
      if (!b->in_tree || clo >= chi)
        continue;
      size_t bytes = gca__expand_mapped_inside(seg, clo, chi);
      if (bytes == 0)
        continue;
      if (pass == 0) {
        n++;
        continue;
      }
      gca__relbatch_add(bt, seg, b, bytes);
      bt->v[bt->n - 1].lo = clo;
      bt->v[bt->n - 1].hi = chi;
      bt->v[bt->n - 1].keep = true;
    }
  }
  return GCA_OK;
}

gca_status_t gca__expand_release_synced(gca__devalloc_t *d, gca__segment_t *seg, size_t lo,
                                        size_t hi, size_t *released, bool remove, bool lend,
                                        uint64_t stamp) {
  GCA_CHECK(release_in(d, seg, lo, hi, released, lend, stamp));
  if (remove && seg->nmaps == 0 && gca__hz_aliases(seg) == 0)
    return segment_remove(d, seg);
  return GCA_OK;
}

void gca__expand_destroy(gca__devalloc_t *d, gca__segment_t *seg) {
  gca__hz_destroy(d, seg); /* its lent ranges first: the reservation goes below */
  for (size_t i = 0; i < seg->nmaps; i++)
    GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_UNMAPPING, seg->base + seg->maps[i].offset,
                                  seg->maps[i].size));
  gca__vmm_destroy(d, seg->base, seg->reserved_size, seg->maps, seg->nmaps);
  gca__owner_remove(seg->base, seg->reserved_size, d->device);
  for (size_t i = 0; i < seg->nparked; i++)
    gca__vmm_release_handle(d, seg->parked[i]);
  free(seg->maps);
  free(seg->parked);
  seg->maps = NULL;
  seg->parked = NULL;
  seg->nmaps = seg->nparked = seg->park_want = 0;
}

/* ---- moves ---- */

/* Note [Moves within a bound]: with expandable_moves:True a growth moves
 * free granules only when creating would take the device's reserved memory
 * past peak live memory by more than 1/256 (0.39%). The live peak is the
 * largest of the allocated peak, the peaks that gca_reset_peak_stats reset
 * (d->live_hwm: a training loop resets them every step) and what is live once
 * this request is served; gca_empty_cache starts it over with the layout it
 * gave back (d->peak_stale: the allocated peak it found, which no longer
 * counts), since a peak kept from before lets fragmentation build while live
 * memory is far below it, more than moves can undo later (the serving traces
 * replayed after another configuration reached 1.0053-1.0061). Below the
 * bound, creating costs about the calls moving does, and no horizon.
 * On the serving traces the bound keeps 1.0039 / 1.0039 / 1.0038 with 79-88%
 * of the calls per pass that moving at every growth made (1.0018 / 1.0000 /
 * 1.0030); transformer-train-a keeps 1.0018 at 76 calls per pass (80 and
 * 1.0016 moving at every growth; 1.0019 and none without moves): a small live
 * set's granule rounding alone passes 0.39%, so its first growths move. An
 * out-of-memory growth moves whatever the bound says. */
static bool growth_within_bound(const gca__devalloc_t *d, size_t lack, size_t rounded) {
  const gca_stat_t *live = &d->stats.allocated_bytes[GCA_STAT_ALL];
  int64_t peak = live->current + (int64_t)rounded;
  if (live->peak > peak && live->peak != d->peak_stale)
    peak = live->peak;
  if (d->live_hwm > peak)
    peak = d->live_hwm;
  return d->stats.reserved_bytes[GCA_STAT_ALL].current + (int64_t)lack <= peak + peak / 256;
}

/* The stamp below which s's free blocks (but p and n) may give granules
 * with no wait (Note [Move horizons]). */
static uint64_t donors_covered(gca__devalloc_t *d, gca__segment_t *s, const gca__block_t *p,
                               const gca__block_t *n) {
  uint64_t need = 0;
  bool any = false;
  for (gca__block_t *b = s->head; b != NULL; b = b->next)
    if (b->in_tree && b != p && b != n &&
        gca__expand_mapped_inside(s, b->addr - s->base, b->addr - s->base + b->size) != 0) {
      any = true;
      if (b->gc_base > need)
        need = b->gc_base;
    }
  return any ? gca__hz_covered(d, s, need) : 0;
}

/* Takes whole free granules of segment s into bt, up to *left bytes (less
 * what it took), but for the blocks p and n (the growth's own neighbours);
 * makes room for their handles in s->parked and has the batch park them
 * there (park_want). Those no queued work uses move with no wait (Note [Move
 * horizons]); in a segment of the growing stream (`own`: its own, or its
 * segment of the other default pool) the others are lent (Note [Lent
 * granules]); in another stream's they are taken only when `waits` (out of
 * memory), the batch synchronizing their stream. */
static gca_status_t take_from(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *s,
                              const gca__block_t *p, const gca__block_t *n, size_t *left,
                              bool waits, bool own) {
  size_t avail = 0;
  bool lends = own && gca__hz_lendable(s);
  uint64_t covered = donors_covered(d, s, p, n);
  for (int pass = 0; pass < 2; pass++) { /* count, make room, then take */
    size_t n_ent = 0, l = *left;
    for (gca__block_t *b = s->head, *next; b != NULL && l > 0; b = next) {
      next = b->next;
      if (!b->in_tree || b == p || b == n || (b->gc_base >= covered && !lends && !waits))
        continue;
      size_t blo = b->addr - s->base, bhi = blo + b->size;
      size_t i = mapping_inside(s, blo, bhi);
      size_t bytes = gca__expand_mapped_inside(s, blo, bhi);
      if (bytes == 0)
        continue;
      if (bytes > l)
        bytes = l;
      l -= bytes;
      n_ent++;
      if (pass == 0)
        continue;
      gca__relbatch_add(bt, s, b, bytes);
      bt->v[bt->n - 1].lo = s->maps[i].offset;
      bt->v[bt->n - 1].hi = s->maps[i].offset + bytes;
      bt->v[bt->n - 1].keep = true;
      bt->v[bt->n - 1].lend = b->gc_base >= covered && lends;
      bt->v[bt->n - 1].safe = b->gc_base < covered || lends;
      bt->v[bt->n - 1].hz = b->gc_base; /* a lent range's stamp (its block is merged at the
                                           batch's end, which stamps it anew) */
    }
    if (pass == 1)
      break;
    avail = *left - l;
    if (n_ent == 0)
      return GCA_OK;
    size_t slots = s->nparked + (s->park_want + avail) / d->granularity;
    gca_memhandle_t *np =
        GCA_FAILPOINT("expand_parked") ? NULL : realloc(s->parked, slots * sizeof(*np));
    if (np == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for %zu handles", slots);
    s->parked = np;
    GCA_CHECK(gca__relbatch_room(bt, n_ent));
  }
  s->park_want += avail;
  *left -= avail;
  return GCA_OK;
}

/* The device's other default pool (small for large and back), NULL for a
 * private pool: its segments' granules are handles of the same size. */
static gca__pool_t *twin(gca__pool_t *pool) {
  gca__devalloc_t *d = pool->dev;
  return pool == &d->small ? &d->large : pool == &d->large ? &d->small : NULL;
}

gca_status_t gca__expand_take_donors(gca__devalloc_t *d, gca__relbatch_t *bt, gca__pool_t *pool,
                                     gca_stream_t stream, size_t rounded, bool oom, bool *held) {
  gca__segment_t *seg = find_segment(pool, stream);
  size_t g = d->granularity;
  *held = false;
  if (!(d->cfg.expandable_moves || oom) || d->ncaptures != 0 || pool->owner != NULL ||
      seg == NULL || seg->nmaps == 0 || g == 0)
    return GCA_OK;
  gca__pool_t *pools[2] = {pool, twin(pool)};
  for (int k = 0; k < 2 && pools[k] != NULL; k++) /* ranges lent before may merge into holes */
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next)
      if (s->stream == stream && gca__hz_aliases(s) != 0)
        gca__hz_retire(d, s, 0);
  gca__block_t *u = best_hole(seg, rounded, g);
  if (u == NULL)
    return GCA_OK;
  bool right;
  size_t lack = grow_len(u, rounded, g, &right);
  /* the free blocks the growth maps beside, which it takes (both when it maps
   * all of u); a neighbour it leaves may give its granules */
  const gca__block_t *p = right ? NULL : u->prev;
  const gca__block_t *n = right || lack == u->size ? u->next : NULL;
  if (lack == 0 || (!oom && growth_within_bound(d, lack, rounded)))
    return GCA_OK;
  if (d->fc_count != 0 || d->rb_count != 0) { /* a block just freed may be the donor */
    *held = true;
    return GCA_OK;
  }
  size_t left = lack;
  GCA_CHECK(take_from(d, bt, seg, p, n, &left, oom, true));
  /* Note [Moves across segments]: the stream's segment of the other pool
   * first (it lends), then other streams' */
  for (int same = 1; same >= 0; same--)
    for (int k = 0; k < 2 && pools[k] != NULL; k++)
      for (gca__segment_t *s = pools[k]->segments; s != NULL && left > 0; s = s->next)
        if (s != seg && (s->stream == stream) == same && s->expandable && !s->stream_gone &&
            s->nmaps != 0)
          GCA_CHECK(take_from(d, bt, s, NULL, NULL, &left, oom, same));
  if (left < lack)
    seg->park_hole = u->addr;
  return GCA_OK;
}

/* Note [Moves across segments]: a growth that finds too few free granules in
 * its own segment takes them from the device's other expandable segments of
 * its default pools (the small and the large pool's handles are one granule
 * each): first its stream's segment of the other pool, whose granules are
 * lent like its own when queued work may still use them (one stream orders
 * both places); then other streams' (not a destroyed stream's, whose wait
 * would be the whole device), granules their stream's horizons cover (Note
 * [Move horizons]), or out of memory any, after the release batch
 * synchronizes the donor's stream; those are never lent, since the growing
 * stream's work is not ordered after theirs. The batch parks the handles in
 * the donor (under the lock, after any wait), and gca__expand_gather moves
 * them to the growing segment before it maps. A handle is not tied to an
 * address range, so any segment of the device can map it. Without this, with moves on, gca-stress
 * on 8 streams peaked at 2.05x its live memory (1.05x on one stream). The parked arrays of other
 * segments are empty whenever a thread holds the lock outside a move (a move parks and maps under
 * the lock), so gathering or releasing them takes nothing another growth is about to map. */
void gca__expand_gather(gca__pool_t *pool, gca_stream_t stream) {
  gca__segment_t *seg = find_segment(pool, stream);
  if (seg == NULL)
    return;
  gca__pool_t *pools[2] = {pool, twin(pool)};
  for (int k = 0; k < 2 && pools[k] != NULL; k++) {
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next) {
      if (s == seg || s->nparked == 0)
        continue;
      gca_memhandle_t *np = GCA_FAILPOINT("expand_gather")
                                ? NULL
                                : realloc(seg->parked, (seg->nparked + s->nparked) * sizeof(*np));
      if (np == NULL) /* gca__expand_unpark releases them; the growth creates instead */
        return;
      seg->parked = np;
      memcpy(seg->parked + seg->nparked, s->parked, s->nparked * sizeof(*np));
      seg->nparked += s->nparked;
      s->nparked = 0;
      s->park_want = 0;
    }
  }
}

void gca__expand_unpark(gca__devalloc_t *d, gca__pool_t *pool) {
  /* every segment of both default pools: donors' handles may be parked in
   * others (Note [Moves across segments]) */
  gca__pool_t *pools[2] = {pool, twin(pool)};
  for (int k = 0; k < 2 && pools[k] != NULL; k++) {
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL; seg = seg->next) {
      for (size_t i = 0; i < seg->nparked; i++)
        gca__vmm_release_handle(d, seg->parked[i]);
      seg->nparked = 0;
      seg->park_want = 0;
      seg->park_hole = 0;
    }
  }
}

/* ---- peer access ---- */

gca_status_t gca__expand_add_peer(gca__devalloc_t *d, int peer) {
  int devs[GCA__MAX_DEVICES + 1];
  if (peer == d->device)
    return GCA_OK;
  for (int i = 0; i < d->npeers; i++)
    if (d->peers[i] == peer)
      return GCA_OK;
  int can = 0;
  GCA_CHECK(d->ops->device_can_access_peer(peer, d->device, &can));
  if (!can)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "enable_peer_access: device %d cannot access device %d's memory", peer,
                      d->device);
  int ndevs = gca__vmm_access_list(d, devs);
  devs[ndevs++] = peer;
  for (gca__pool_t *pool = &d->small; pool != NULL; pool = gca__pool_next(d, pool)) {
    for (gca__segment_t *s = pool->segments; s != NULL; s = s->next) {
      for (size_t i = 0, j; i < s->nmaps; i = j) {        /* expandable and VMM-backed classic */
        size_t end = s->maps[i].offset + s->maps[i].size; /* one call per run of mappings */
        for (j = i + 1; j < s->nmaps && s->maps[j].offset == end; j++)
          end += s->maps[j].size;
        gca_status_t st = d->ops->mem_set_access(s->base + s->maps[i].offset,
                                                 end - s->maps[i].offset, devs, ndevs);
        if (st != GCA_OK)
          return gca__error_prefix(st, "enable_peer_access: device %d for device %d's 0x%" PRIx64,
                                   peer, d->device, s->base + s->maps[i].offset);
      }
    }
  }
  d->peers[d->npeers++] = peer;
  return GCA_OK;
}

/* ---- invariants ---- */

#define BROKEN(...) gca__error(GCA_ERR_INTERNAL, "allocator_check: " __VA_ARGS__)

gca_status_t gca__expand_check(const gca__devalloc_t *d, const gca__segment_t *seg) {
  size_t g = d->granularity, mi = 0, mapped = 0;
  if (g == 0 || seg->reserved_size % g != 0 || seg->base % g != 0)
    return BROKEN("expandable segment 0x%" PRIx64 ": reservation not on the granularity",
                  seg->base);
  for (size_t i = 0; i < seg->nmaps; i++) {
    const gca__mapping_t *m = &seg->maps[i];
    if (m->size == 0 || m->offset % g || m->size % g || m->offset + m->size > seg->reserved_size ||
        (i > 0 && seg->maps[i - 1].offset + seg->maps[i - 1].size > m->offset))
      return BROKEN("expandable segment 0x%" PRIx64 ": mapping %zu (+%zu, %zu bytes) misplaced",
                    seg->base, i, m->offset, m->size);
    mapped += m->size;
  }
  if (mapped != seg->size)
    return BROKEN("expandable segment 0x%" PRIx64 ": mappings hold %zu bytes, size says %zu",
                  seg->base, mapped, seg->size);
  for (const gca__block_t *b = seg->head; b != NULL;) {
    size_t lo = b->addr - seg->base;
    if (b->unmapped) {
      if (lo % g || b->size % g || b->allocated || b->in_tree || b->event_count || b->requested)
        return BROKEN("unmapped block 0x%" PRIx64 ": misaligned or marked in use", b->addr);
      if (is_hole(b) && is_hole(b->next))
        return BROKEN("unmapped blocks 0x%" PRIx64 " and 0x%" PRIx64 " not merged", b->addr,
                      b->next->addr);
      if (mi < seg->nmaps && seg->maps[mi].offset < lo + b->size)
        return BROKEN("unmapped block 0x%" PRIx64 ": a mapping lies inside it", b->addr);
      b = b->next;
      continue;
    }
    size_t hi = lo;
    while (b != NULL && !b->unmapped) {
      hi += b->size;
      b = b->next;
    }
    for (size_t at = lo; at < hi; at += seg->maps[mi++].size)
      if (mi == seg->nmaps || seg->maps[mi].offset != at)
        return BROKEN("expandable segment 0x%" PRIx64 ": mapped blocks at +%zu..+%zu are not "
                      "covered by mappings",
                      seg->base, lo, hi);
    if (mi > 0 && seg->maps[mi - 1].offset + seg->maps[mi - 1].size != hi)
      return BROKEN("expandable segment 0x%" PRIx64 ": a mapping crosses +%zu into unmapped space",
                    seg->base, hi);
  }
  if (mi != seg->nmaps)
    return BROKEN("expandable segment 0x%" PRIx64 ": %zu mappings under no block", seg->base,
                  seg->nmaps - mi);
  return GCA_OK;
}
