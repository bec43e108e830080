/* SPDX-License-Identifier: Apache-2.0 */
/* horizon.c - move horizons: which free ranges of an expandable segment the
 * work queued on its stream no longer uses, known without waiting for it;
 * and the lent ranges whose driver mappings wait for them.
 *
 * Note [Move horizons]. A handle move unmaps the whole granules of a free
 * block and maps their handles where a growth needs them. The driver unmaps
 * at once (contract_mem's vmm_calls_do_not_wait_for_work_queued_on_the_device),
 * and a free is stream-ordered: kernels queued on the segment's stream before
 * the free may still read and write the block. Unmapped under them, they
 * fault; mapped in another stream's segment, the handle takes their late
 * writes into a block whose own work is not ordered after them. So a move
 * used to synchronize the donor's stream, which stalls a host that runs ahead
 * of its stream (an engine's normal state) on every move. Instead:
 *
 *   - every block carries the pool's clock from when it last became free
 *     (gc_base, the field classic segments keep their GC age in; the clock
 *     is pool->free_calls, which horizons advance as well as GC lookups, and
 *     GC reads ages of whole segments only); a merge takes the later stamp,
 *     a split remainder keeps its block's;
 *   - each expandable segment keeps a ring of up to GCA__HZ_RING events
 *     recorded on its stream (horizons), each tagged with the clock when it
 *     was recorded, after which the clock advances; once a horizon has
 *     completed, every block freed before it was recorded is past the work
 *     queued on the stream: done = tag + 1, and a free block whose stamp is
 *     below done is covered. A stream that stream_query finds idle is a
 *     horizon completed at once, and a release batch's wait for the stream
 *     covers what was stamped before it (release.c).
 *
 * A covered granule moves as before (unmapped, parked, mapped at the
 * growth). An uncovered one of another stream's segment is not taken (but
 * out of memory); one of the growing stream's segments is lent (Note [Lent
 * granules]). Horizons are
 * polled and recorded only where a growth would move (past the bound of Note
 * [Moves within a bound]) and a donor or a lent range is not yet covered,
 * never on the free path: at most an event_query per pending horizon, a
 * stream_query and an event_record per donor segment and growth. An
 * out-of-memory growth takes every donor and synchronizes their streams
 * (release.c's Note [Moves on out of memory]): a wait beats a failed request.
 * No horizon is recorded or queried while a capture runs anywhere (the
 * queries would be refused and would invalidate it; nothing moves then
 * either), nor for another thread's per-thread stream or a destroyed stream,
 * which no handle here reaches: their segments give only covered granules,
 * and lend none. A failed event or query call only leaves blocks uncovered
 * for longer (logged at debug level).
 *
 * Note [Lent granules]. In the growing stream's own segments (the growing
 * one, and its segment of the other default pool) a move does not need its
 * donors covered: the handle of a free granule that queued work may still
 * use is mapped at the growth's place while its old mapping stays (the
 * driver maps one handle at several addresses; contract_mem's
 * a_handle_maps_at_two_addresses_as_the_same_memory), and both places belong
 * to one stream, so whatever is queued for the new block runs after the old
 * work, exactly as when a freed block is reused in place. For the allocator
 * the old range is gone at once: an unmapped block that is no hole (marked
 * releasing: never mapped, allocated or merged; gca__block_lent), its
 * mappings out of seg->maps, its bytes out of reserved memory (the handle
 * counts once, at its new place), recorded here with its block's stamp. The
 * driver unmap follows once a horizon covers the stamp (polled when the
 * segment's next growth would move) or a release batch has waited for the
 * stream (gca_empty_cache, out of memory: gca__expand_take adds a wait for a
 * segment with lent ranges); then the block is an ordinary unmapped one,
 * merged with its neighbours. A lent range holds no memory of its own, only
 * address space, of which an expandable segment has twice the device's. So
 * moves neither wait nor give up for a busy stream: with gca-replay's --lag
 * the serving traces of gca-trace-gen keep 1.0034-1.0039 (seed 1 at lags of
 * 10 to 10,000 events, seeds 1-3 at 1,000), where taking covered granules
 * only reached 1.06-1.14 on seed 1. Lent ranges do hold address space: a
 * growth that finds no hole for them waits for its stream (Note [Lent
 * address space], release.c). With no host memory to record a lent
 * range, that donor stays mapped and the growth creates instead.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "expandable.h"

#define GCA__HZ_RING 4

/* A lent range (Note [Lent granules]): block r, unmapped for the allocator,
 * still mapped in the driver until a horizon covers `stamp`. */
typedef struct gca__alias {
  gca__block_t *r;
  uint64_t stamp;
} gca__alias_t;

struct gca__horizons {
  gca_event_t ev[GCA__HZ_RING]; /* created on first use, kept until the segment goes */
  uint64_t tag[GCA__HZ_RING];
  unsigned head, n; /* pending horizons: ev[head], ev[head + 1], ... oldest first */
  uint64_t done;    /* a free block stamped below this is no longer used by queued work */
  gca__alias_t *al; /* the segment's lent ranges, oldest first */
  size_t nal, cap_al;
};

/* The handle that reaches seg's stream from this thread, and whether d's
 * device must be current for it; false when none does. */
static bool stream_handle(const gca__segment_t *seg, gca_stream_t *h, bool *cur) {
  gca_stream_t s = seg->stream;
  if (seg->stream_gone)
    return false;
  if (gca__stream_is_ptds(s)) {
    if (s != gca__t_ptds_key) /* another thread's, or GCA__STREAM_GONE */
      return false;
    *h = GCA_STREAM_PER_THREAD;
    *cur = true;
    return true;
  }
  *h = s;
  *cur = s == NULL; /* the device's legacy stream */
  return true;
}

static void hz_fail(const gca__segment_t *seg, const char *what) {
  GCA_LOG_DEBUG("expandable segment 0x%" PRIx64 ": %s failed, its free ranges wait for a later "
                "horizon: %s",
                seg->base, what, gca_last_error());
}

/* Polls seg's pending horizons (oldest first); then, if a block stamped
 * `need` is still not covered, asks whether the stream is idle (when no
 * pending horizon says it is busy) and, if not, records a horizon unless a
 * pending one already covers `need`. With d's device current where the
 * handle needs it. */
static void update(gca__devalloc_t *d, gca__segment_t *seg, gca__horizons_t *z, gca_stream_t h,
                   uint64_t need) {
  gca__pool_t *pool = seg->pool;
  bool busy = false;
  while (z->n != 0 && !busy) {
    unsigned i = z->head;
    gca__count_calls(d, 1);
    gca_status_t st = d->ops->event_query(z->ev[i]);
    if (st == GCA_ERR_NOT_READY) {
      busy = true;
    } else if (st != GCA_OK) {
      hz_fail(seg, "a horizon's event_query");
      z->n = 0; /* what they would have said is lost; later horizons say it again */
    } else {
      z->done = z->tag[i] + 1;
      z->head = (i + 1) % GCA__HZ_RING;
      z->n--;
    }
  }
  if (need < z->done)
    return;
  if (!busy) {
    gca__count_calls(d, 1);
    gca_status_t st = d->ops->stream_query(h);
    if (st == GCA_OK) { /* idle: every block freed so far is covered */
      z->done = ++pool->free_calls;
      return;
    }
    if (st != GCA_ERR_NOT_READY) {
      hz_fail(seg, "stream_query");
      return;
    }
  }
  if (z->n == GCA__HZ_RING || (z->n != 0 && z->tag[(z->head + z->n - 1) % GCA__HZ_RING] >= need))
    return; /* no room, or a pending horizon will cover it */
  unsigned i = (z->head + z->n) % GCA__HZ_RING;
  if (z->ev[i] == NULL) {
    gca__count_calls(d, 1);
    if (d->ops->event_create(d->device, GCA_EVENT_DISABLE_TIMING, &z->ev[i]) != GCA_OK) {
      z->ev[i] = NULL;
      hz_fail(seg, "a horizon's event_create");
      return;
    }
  }
  gca__count_calls(d, 1);
  if (d->ops->event_record(z->ev[i], h) != GCA_OK) {
    hz_fail(seg, "a horizon's event_record");
    return;
  }
  z->tag[i] = pool->free_calls++;
  z->n++;
}

static gca__horizons_t *horizons(gca__segment_t *seg) {
  if (seg->hz == NULL) {
    seg->hz = GCA_FAILPOINT("horizon_alloc") ? NULL : calloc(1, sizeof(*seg->hz));
    if (seg->hz == NULL)
      GCA_LOG_DEBUG("expandable segment 0x%" PRIx64 ": host out of memory for its horizons",
                    seg->base);
  }
  return seg->hz;
}

uint64_t gca__hz_covered(gca__devalloc_t *d, gca__segment_t *seg, uint64_t need) {
  gca__horizons_t *z = seg->hz;
  gca_stream_t h;
  bool cur = false;
  if (z != NULL && need < z->done)
    return z->done;
  if (atomic_load_explicit(&gca__device_captures, memory_order_relaxed) != 0 ||
      !stream_handle(seg, &h, &cur))
    return z != NULL ? z->done : 0;
  if (z == NULL && (z = horizons(seg)) == NULL)
    return 0;
  int prev = d->device;
  if (cur) {
    gca__count_calls(d, 1);
    if (d->ops->ctx_get_device(&prev) != GCA_OK) {
      hz_fail(seg, "ctx_get_device");
      return z->done;
    }
    if (prev != d->device) {
      gca__count_calls(d, 1);
      if (d->ops->ctx_set_device(d->device) != GCA_OK) {
        hz_fail(seg, "ctx_set_device");
        return z->done;
      }
    }
  }
  update(d, seg, z, h, need);
  if (prev != d->device) {
    gca__count_calls(d, 1);
    if (d->ops->ctx_set_device(prev) != GCA_OK)
      hz_fail(seg, "ctx_set_device back");
  }
  return z->done;
}

bool gca__hz_lendable(const gca__segment_t *seg) {
  gca_stream_t h;
  bool cur;
  return stream_handle(seg, &h, &cur);
}

gca_status_t gca__hz_alias_room(gca__segment_t *seg, size_t more) {
  gca__horizons_t *z = horizons(seg);
  if (z == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for move horizons");
  if (z->nal + more <= z->cap_al)
    return GCA_OK;
  size_t ncap = z->cap_al ? z->cap_al * 2 : 8;
  while (ncap < z->nal + more)
    ncap *= 2;
  gca__alias_t *n = GCA_FAILPOINT("horizon_alias") ? NULL : realloc(z->al, ncap * sizeof(*n));
  if (n == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for %zu lent ranges",
                      ncap);
  z->al = n;
  z->cap_al = ncap;
  return GCA_OK;
}

/* stats.lent_bytes moves by n (Note [Lent granules]). */
static void lent_account(gca__segment_t *seg, int64_t n) {
  gca__devalloc_t *d = seg->pool->dev;
  gca__stat_add(d, &d->stats.lent_bytes, n);
}

void gca__hz_alias_add(gca__segment_t *seg, gca__block_t *r, uint64_t stamp) {
  gca__horizons_t *z = seg->hz; /* room made by gca__hz_alias_room */
  z->al[z->nal++] = (gca__alias_t){r, stamp};
  lent_account(seg, (int64_t)r->size);
}

size_t gca__hz_aliases(const gca__segment_t *seg) {
  return seg->hz != NULL ? seg->hz->nal : 0;
}

void gca__hz_retire(gca__devalloc_t *d, gca__segment_t *seg, uint64_t waited) {
  gca__horizons_t *z = seg->hz;
  if (z == NULL)
    return;
  if (waited > z->done)
    z->done = waited;
  if (z->nal == 0)
    return;
  if (waited == 0) {
    uint64_t need = 0;
    for (size_t i = 0; i < z->nal; i++)
      if (z->al[i].stamp > need)
        need = z->al[i].stamp;
    (void)gca__hz_covered(d, seg, need);
  }
  size_t k = 0;
  for (size_t i = 0; i < z->nal; i++) {
    gca__alias_t a = z->al[i];
    if (a.stamp < z->done) {
      gca_status_t st = gca__vmm_unmap_keep(d, a.r->addr, a.r->size);
      if (st == GCA_OK) {
        lent_account(seg, -(int64_t)a.r->size);
        gca__expand_unlend(d, a.r);
        continue;
      }
      GCA_LOG_WARN("expandable segment 0x%" PRIx64 ": unmapping the lent range 0x%" PRIx64
                   " (%zu bytes) failed, tried again later: %s",
                   seg->base, a.r->addr, a.r->size, gca_last_error());
    }
    z->al[k++] = a;
  }
  z->nal = k;
}

void gca__hz_destroy(gca__devalloc_t *d, gca__segment_t *seg) {
  gca__horizons_t *z = seg->hz;
  if (z == NULL)
    return;
  for (size_t i = 0; i < z->nal; i++) { /* teardown: queued work is not waited for */
    GCA_CHECK_IGNORE(gca__vmm_unmap_keep(d, z->al[i].r->addr, z->al[i].r->size));
    lent_account(seg, -(int64_t)z->al[i].r->size);
  }
  free(z->al);
  for (int i = 0; i < GCA__HZ_RING; i++)
    if (z->ev[i] != NULL)
      GCA_CHECK_IGNORE(d->ops->event_destroy(z->ev[i]));
  free(z);
  seg->hz = NULL;
}
