/* SPDX-License-Identifier: Apache-2.0 */
/* alloc_stats.h - the statistics' updates, inline for the hot paths:
 * PyTorch's counters (current, peak, allocated, freed) by pool type and for
 * all, the pending statistics, and the update of a block's allocation and
 * free. Included by alloc_core.h after the device's structure; stats.c reads
 * and resets them.
 */
#ifndef GCA_ALLOC_STATS_H
#define GCA_ALLOC_STATS_H

#ifndef GCA_ALLOC_CORE_H
#error "alloc_stats.h is included by alloc_core.h"
#endif

/* ---- statistics (inline: they are on the hot path) ----
 *
 * Note [Statistics]: PyTorch's shape, each statistic as current/peak/
 * allocated/freed for all/small/large. A change for pool p touches p's entry
 * (small or large) and ALL's current and peak; ALL.allocated and ALL.freed are
 * not kept on the hot path, since they always equal small + large: they are
 * filled in when statistics are read (gca__stats_read). The caller holds
 * the device lock.
 *
 * Note [Active statistics]: a block is active from its allocation until its
 * free completes, so active = allocation + the pending-free blocks (freed,
 * waiting for events of other streams or for a capture to end), and the same
 * in bytes. The allocator keeps only the pending part (d->pend, d->pend_bytes)
 * and derives active when statistics are read:
 *   current   = allocation.current + pend.current
 *   allocated = allocation.allocated (every allocation activates its block)
 *   freed     = allocation.freed + pend.base - pend.current (completed frees)
 *   peak      = max(allocation.peak, pend.peak)
 * The peak holds because both peaks are reset together, allocation <= active
 * at all times, and active rises above allocation only while something is
 * pending: each allocation made while pend.current != 0 raises pend.peak to
 * allocation + pend (gca__pend_peak); a free request moves a block from
 * allocation to pend and leaves the sum unchanged. So a free and an
 * allocation each update five statistics, not seven; the free cache's paths
 * run with nothing pending and skip pend entirely. */

/* The index of statistic s of d->stats in the nine per-pool arrays, or -1
 * (oversize_allocations, oversize_segments). */
static inline int gca__stat_index(const gca__devalloc_t *d, const gca_stat_t *s) {
  uintptr_t off = (uintptr_t)s - (uintptr_t)d->stats.allocation;
  return off < GCA__TC_NSTATS * sizeof(gca_stat_t) ? (int)(off / sizeof(gca_stat_t)) : -1;
}
_Static_assert(offsetof(gca_stats_t, requested_bytes) == 8 * GCA_STAT_TYPES * sizeof(gca_stat_t),
               "the nine per-pool arrays lead gca_stats_t, one after another");

/* tcstats.c: statistic s (index i, -1 for none) passed its peak less the
 * headroom held for it: folds the thread caches, takes their headroom for
 * it back, and sets the peak from the exact current (Note [Thread caches]). */
void gca__stat_peak_slow(gca__devalloc_t *d, gca_stat_t *s, int i);

/* With thread caches the current kept here is not the whole current; what
 * they may add is at most tc_esc[i], so while s's current plus n stays at or
 * below peak - tc_esc[i] the peak cannot be passed (Note [Thread caches]).
 * i: s's index (gca__stat_index), -1 for a statistic they never move. */
static inline bool gca__stat_below_peak(const gca__devalloc_t *d, const gca_stat_t *s, int i,
                                        int64_t n) {
  return s->current + n + (i >= 0 ? d->tc_esc[i] : 0) <= s->peak;
}

/* After s rose: its peak (gca__stat_below_peak, else a fold). */
static inline void gca__stat_peak(gca__devalloc_t *d, gca_stat_t *s) {
  if (GCA_LIKELY(!d->tc_count)) {
    if (s->current > s->peak)
      s->peak = s->current;
    return;
  }
  int i = gca__stat_index(d, s);
  if (!gca__stat_below_peak(d, s, i, 0))
    gca__stat_peak_slow(d, s, i);
}

/* Adds n >= 0 to a single statistic. */
static inline void gca__stat_inc1(gca__devalloc_t *d, gca_stat_t *s, int64_t n) {
  s->current += n;
  s->allocated += n;
  gca__stat_peak(d, s);
}

/* Removes n >= 0 from a single statistic. */
static inline void gca__stat_dec1(gca_stat_t *s, int64_t n) {
  s->current -= n;
  s->freed += n;
}

/* Adds n (either sign) to a single statistic. */
static inline void gca__stat_add(gca__devalloc_t *d, gca_stat_t *s, int64_t n) {
  if (n >= 0)
    gca__stat_inc1(d, s, n);
  else
    gca__stat_dec1(s, -n);
}

/* The statistic type of pool p: GCA_STAT_SMALL or GCA_STAT_LARGE. */
static inline int gca__stat_type(const gca__pool_t *p) {
  return p->is_small ? GCA_STAT_SMALL : GCA_STAT_LARGE;
}

/* Adds n >= 0 to the statistic array `arr` (of d->stats) for type t (small or large). */
static inline void gca__stat_inc_t(gca__devalloc_t *d, gca_stat_t *arr, int t, int64_t n) {
  gca_stat_t *x = &arr[t], *all = &arr[GCA_STAT_ALL];
  x->current += n;
  x->allocated += n;
  all->current += n;
  if (GCA_LIKELY(!d->tc_count)) { /* one test for both peaks on the hot path */
    if (x->current > x->peak)
      x->peak = x->current;
    if (all->current > all->peak)
      all->peak = all->current;
    return;
  }
  int i = gca__stat_index(d, arr); /* one index for both (gca__stat_peak) */
  if (GCA_UNLIKELY(i < 0)) {
    gca__stat_peak(d, x);
    gca__stat_peak(d, all);
    return;
  }
  if (!gca__stat_below_peak(d, x, i + t, 0))
    gca__stat_peak_slow(d, x, i + t);
  if (!gca__stat_below_peak(d, all, i + GCA_STAT_ALL, 0))
    gca__stat_peak_slow(d, all, i + GCA_STAT_ALL);
}

/* Removes n >= 0 from the statistic array `arr` for type t. */
static inline void gca__stat_dec_t(gca__devalloc_t *d, gca_stat_t *arr, int t, int64_t n) {
  (void)d;
  gca__stat_dec1(&arr[t], n);
  arr[GCA_STAT_ALL].current -= n;
}

/* Adds n (either sign) to the statistic array `arr` for type t. */
static inline void gca__stat_add_t(gca__devalloc_t *d, gca_stat_t *arr, int t, int64_t n) {
  if (n >= 0)
    gca__stat_inc_t(d, arr, t, n);
  else
    gca__stat_dec_t(d, arr, t, -n);
}

/* The same for pool p. */
static inline void gca__stat_inc(gca__devalloc_t *d, gca_stat_t *arr, const gca__pool_t *p,
                                 int64_t n) {
  gca__stat_inc_t(d, arr, gca__stat_type(p), n);
}
static inline void gca__stat_dec(gca__devalloc_t *d, gca_stat_t *arr, const gca__pool_t *p,
                                 int64_t n) {
  gca__stat_dec_t(d, arr, gca__stat_type(p), n);
}
static inline void gca__stat_pool(gca__devalloc_t *d, gca_stat_t *arr, const gca__pool_t *p,
                                  int64_t n) {
  gca__stat_add_t(d, arr, gca__stat_type(p), n);
}

/* tcstats.c: active (Note [Active statistics]) of type index idx with the
 * headroom held for it could pass its peak: folds the thread caches and
 * takes the headroom of allocation and allocated_bytes back, so the
 * currents read after it are exact (Note [Thread caches]). */
void gca__pend_peak_slow(gca__devalloc_t *d, int idx);

/* After allocation rose for type t: keeps active's peak (Note [Active
 * statistics]) while something is pending. The thread caches' headroom for
 * allocation is also theirs for active (Note [Thread caches]). */
static inline void gca__pend_peak(gca__devalloc_t *d, int t) {
  int idx[2] = {t, GCA_STAT_ALL};
  for (int i = 0; i < 2; i++) {
    gca__pend_stat_t *p = &d->pend[idx[i]], *pb = &d->pend_bytes[idx[i]];
    const gca_stat_t *al = &d->stats.allocation[idx[i]], *ab = &d->stats.allocated_bytes[idx[i]];
    if (GCA_UNLIKELY(d->tc_count) &&
        ((p->current != 0 && al->current + p->current + d->tc_esc[idx[i]] >
                                 (al->peak > p->peak ? al->peak : p->peak)) ||
         (pb->current != 0 && ab->current + pb->current + d->tc_esc[4 * GCA_STAT_TYPES + idx[i]] >
                                  (ab->peak > pb->peak ? ab->peak : pb->peak))))
      gca__pend_peak_slow(d, idx[i]);
    int64_t a = al->current + p->current;
    int64_t b = ab->current + pb->current;
    if (p->current != 0 && a > p->peak)
      p->peak = a;
    if (pb->current != 0 && b > pb->peak)
      pb->peak = b;
  }
}

/* A block of pool p (size bytes) starts (sign 1) or stops (-1) being pending-free. */
static inline void gca__pend_add(gca__devalloc_t *d, const gca__pool_t *p, int sign, size_t size) {
  int idx[2] = {gca__stat_type(p), GCA_STAT_ALL};
  for (int i = 0; i < 2; i++) {
    d->pend[idx[i]].current += sign;
    d->pend_bytes[idx[i]].current += sign * (int64_t)size;
  }
}

/* The statistics of block b becoming allocated (b->requested already set) in
 * a pool of type t: allocation, allocated_bytes, requested_bytes,
 * oversize_allocations and, unless `quiet` (the caller knows nothing is
 * pending), active's peak (Note [Active statistics]). */
static inline void gca__stat_block_alloc(gca__devalloc_t *d, gca__block_t *b, int t, bool quiet) {
  gca__stat_inc_t(d, d->stats.allocation, t, 1);
  gca__stat_inc_t(d, d->stats.allocated_bytes, t, (int64_t)b->size);
  if (!quiet && GCA_UNLIKELY(d->pend[GCA_STAT_ALL].current != 0))
    gca__pend_peak(d, t);
  gca__stat_inc_t(d, d->stats.requested_bytes, t, (int64_t)b->requested);
  b->oversize = b->size >= d->cfg.max_split_size;
  if (b->oversize)
    gca__stat_add(d, &d->stats.oversize_allocations, 1);
}

/* The statistics of allocated block b's free request (allocation,
 * allocated_bytes, oversize_allocations); requested_bytes goes when the free
 * completes, and active follows from pend (Note [Active statistics]). */
static inline void gca__stat_block_free(gca__devalloc_t *d, gca__block_t *b, int t) {
  gca__stat_dec_t(d, d->stats.allocation, t, 1);
  gca__stat_dec_t(d, d->stats.allocated_bytes, t, (int64_t)b->size);
  if (b->oversize)
    gca__stat_add(d, &d->stats.oversize_allocations, -1);
  b->oversize = false;
}

#endif
