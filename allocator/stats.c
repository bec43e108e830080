/* SPDX-License-Identifier: Apache-2.0 */
/* stats.c - a device's statistics as PyTorch's memory_stats gives them:
 * gca_get_stats, gca_reset_peak_stats, gca_reset_accumulated_stats.
 *
 * The one idea: the counters are kept where they change (the locked paths,
 * and the thread caches' deltas, Note [Thread caches]) and made whole only
 * when read: every cache is folded in under the device's lock, ALL's
 * allocated/freed are summed from the pools (Note [Statistics]) and active
 * is derived from allocation and the pending frees (Note [Active
 * statistics]).
 */
#include "tcache.h"

/* ---- what readers see ---- */

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
  out->num_lock_revocations = (int64_t)d->lock.revocations;
  stats_fill_all(out);
  for (int t = 0; t < GCA_STAT_TYPES; t++) {
    stat_active(&out->active[t], &out->allocation[t], &d->pend[t]);
    stat_active(&out->active_bytes[t], &out->allocated_bytes[t], &d->pend_bytes[t]);
  }
}

/* ---- reading and resetting ---- */

GCA_API gca_status_t gca_get_stats(int device, gca_stats_t *out) {
  gca__devalloc_t *d;
  if (out == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_stats: the output pointer is NULL");
  GCA_CHECK(gca__devalloc_get("get_stats", device, &d));
  gca__dev_lock(d);
  gca__tc_fold(d, 0); /* Note [Thread caches]: every cache at one instant */
  gca__stats_read(d, out);
  gca__dev_unlock(d);
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
  X(&(st).oversize_segments, 1);                \
  X(&(st).lent_bytes, 1)

GCA_API gca_status_t gca_reset_peak_stats(int device) {
  gca__devalloc_t *d;
  GCA_CHECK(gca__devalloc_get("reset_peak_stats", device, &d));
  gca__dev_lock(d);
  gca__tc_fold(d, ~0u); /* exact currents, and no headroom above them (Note [Thread caches]) */
  int64_t peak = d->stats.allocated_bytes[GCA_STAT_ALL].peak; /* Note [Moves within a bound] */
  if (peak != d->peak_stale && peak > d->live_hwm)
    d->live_hwm = peak;
  d->peak_stale = -1;
  FOR_EACH_STAT_ARRAY(reset_peak, d->stats);
  for (int t = 0; t < GCA_STAT_TYPES; t++) { /* Note [Active statistics] */
    d->pend[t].peak = d->stats.allocation[t].current + d->pend[t].current;
    d->pend_bytes[t].peak = d->stats.allocated_bytes[t].current + d->pend_bytes[t].current;
  }
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_reset_accumulated_stats(int device) {
  gca__devalloc_t *d;
  GCA_CHECK(gca__devalloc_get("reset_accumulated_stats", device, &d));
  gca__dev_lock(d);
  gca__tc_fold(d, 0); /* Note [Thread caches] */
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
  d->stats.num_driver_calls = 0;
  d->stats.grown_bytes = 0;
  d->stats.num_handle_moves = 0;
  d->stats.num_lent_waits = 0;
  d->stats.num_cache_fences = 0;
  d->stats.num_cache_parks = 0;
  d->lock.revocations = 0; /* under the lock it counts for */
  gca__dev_unlock(d);
  return GCA_OK;
}
