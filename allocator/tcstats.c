/* SPDX-License-Identifier: Apache-2.0 */
/* tcstats.c - the statistics of the thread caches (Note [Thread caches],
 * tcache.c): folding their deltas into the device's statistics (what a
 * cache gave back becomes its headroom), taking headroom back, and the peak
 * of a statistic that the headroom may hide. Every floor calls it (the statistics helpers of
 * alloc_core.h), so it calls nothing but the caches' locks.
 */
#include <inttypes.h>

#include "tcache.h"

/* The array of d->stats (its index / GCA_STAT_TYPES) each quantity moves,
 * and the derived active array that moves with it (-1: none). */
static const int q_array[GCA__TQ] = {0, 4, 8, 3, 7};
static const int q_active[GCA__TQ] = {2, 6, -1, -1, -1};
#define ARRAY_ALLOCATION      0
#define ARRAY_ACTIVE          2
#define ARRAY_ALLOCATED_BYTES 4
#define ARRAY_ACTIVE_BYTES    6

/* Statistic i of the nine per-pool arrays of d->stats. */
static gca_stat_t *stat_at(gca__devalloc_t *d, int i) {
  return (gca_stat_t *)&d->stats + i;
}

/* The quantity that moves array a, or -1. */
static int quantity_of(int a) {
  for (int q = 0; q < GCA__TQ; q++)
    if (q_array[q] == a || q_active[q] == a)
      return q;
  return -1;
}

/* Adds n to the headroom counted for quantity q of type t (and of all). */
static void esc_add(gca__devalloc_t *d, int q, int t, int64_t n) {
  int a = q_array[q] * GCA_STAT_TYPES;
  d->tc_esc[a + t] += n;
  d->tc_esc[a + GCA_STAT_ALL] += n;
  if (q_active[q] >= 0) {
    int b = q_active[q] * GCA_STAT_TYPES;
    d->tc_esc[b + t] += n;
    d->tc_esc[b + GCA_STAT_ALL] += n;
  }
}

void gca__tc_lock_all(gca__devalloc_t *d) {
  bool fence = false; /* one fence for every quiet cache (Note [Thread cache sections]) */
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next) {
    gca__tc_lock_raw(tc);
    fence |= gca__tc_blocks(tc);
  }
  if (fence) {
    gca__tc_fence_all();
    d->stats.num_cache_fences++;
    for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next)
      if (atomic_load_explicit(&tc->quiet, memory_order_relaxed) == GCA__TC_BLOCKED)
        gca__tc_wait_out(tc);
  }
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next)
    gca__tc_settle_hot(tc); /* Note [Thread cache streaks] */
}

void gca__tc_unlock_all(gca__devalloc_t *d) {
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next)
    gca__tc_unlock_wake(tc);
}

void gca__tc_fold_one(gca__devalloc_t *d, gca__tcache_t *tc, unsigned revoke) {
  gca__tc_settle_hot(tc);
  for (int ti = 0; ti < 2; ti++) {
    int t = ti + 1;
    for (int q = 0; q < GCA__TQ; q++) {
      int64_t delta = tc->base[ti][q] - tc->room[ti][q];
      gca_stat_t *x = stat_at(d, q_array[q] * GCA_STAT_TYPES);
      x[t].current += delta;
      x[t].allocated += tc->up[ti][q];
      x[t].freed += tc->up[ti][q] - delta;
      x[GCA_STAT_ALL].current += delta; /* all's allocated and freed are summed when read */
      /* G + allow stays (what was freed may come back): allow - delta, the room */
      esc_add(d, q, t, -delta);
      tc->up[ti][q] = 0;
      if (revoke & (1u << q)) {
        esc_add(d, q, t, -tc->room[ti][q]);
        tc->room[ti][q] = 0;
      }
      tc->base[ti][q] = tc->room[ti][q];
    }
  }
}

void gca__tc_fold_locked(gca__devalloc_t *d, unsigned revoke) {
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next)
    gca__tc_fold_one(d, tc, revoke);
}

void gca__tc_fold(gca__devalloc_t *d, unsigned revoke) {
  if (!d->tc_count) /* no delta and no headroom to fold or take back */
    return;
  gca__tc_lock_all(d);
  gca__tc_fold_locked(d, revoke);
  gca__tc_unlock_all(d);
}

void gca__stat_peak_slow(gca__devalloc_t *d, gca_stat_t *s, int i) {
  int q = i >= 0 ? quantity_of(i / GCA_STAT_TYPES) : -1;
  if (q >= 0) /* the exact current, and no headroom left above it */
    gca__tc_fold(d, 1u << q);
  if (s->current > s->peak)
    s->peak = s->current;
}

void gca__pend_peak_slow(gca__devalloc_t *d, int idx) {
  (void)idx;
  gca__tc_fold(d, 1u << GCA__TQ_BLOCKS | 1u << GCA__TQ_BYTES);
}

/* What the peak leaves over statistic (array a, type t) and the headroom
 * held for it; for active, over allocation + pending. */
static int64_t room(gca__devalloc_t *d, int a, int t) {
  const gca_stat_t *x = stat_at(d, a * GCA_STAT_TYPES + t);
  int64_t r = x->peak - x->current;
  if (a == ARRAY_ACTIVE || a == ARRAY_ACTIVE_BYTES) {
    const gca__pend_stat_t *p = a == ARRAY_ACTIVE ? &d->pend[t] : &d->pend_bytes[t];
    const gca_stat_t *al = stat_at(
        d, (a == ARRAY_ACTIVE ? ARRAY_ALLOCATION : ARRAY_ALLOCATED_BYTES) * GCA_STAT_TYPES + t);
    r = (al->peak > p->peak ? al->peak : p->peak) - (al->current + p->current);
  }
  return r - d->tc_esc[a * GCA_STAT_TYPES + t];
}

gca_status_t gca__tc_check_escrow(const gca__devalloc_t *dc) {
  gca__devalloc_t *d = (gca__devalloc_t *)dc; /* read only */
  int64_t sum[GCA__TC_NSTATS] = {0};
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next) {
    for (int ti = 0; ti < 2; ti++) {
      for (int q = 0; q < GCA__TQ; q++) {
        if (tc->up[ti][q] != 0 || tc->base[ti][q] != tc->room[ti][q] || tc->room[ti][q] < 0)
          return gca__error(GCA_ERR_INTERNAL,
                            "allocator_check: device %d: a thread cache's delta %" PRId64
                            " (rises %" PRId64 ", room %" PRId64 ") after a fold",
                            d->device, tc->base[ti][q] - tc->room[ti][q], tc->up[ti][q],
                            tc->room[ti][q]);
        int a = q_array[q] * GCA_STAT_TYPES;
        sum[a + ti + 1] += tc->room[ti][q];
        sum[a + GCA_STAT_ALL] += tc->room[ti][q];
        if (q_active[q] >= 0) {
          int b = q_active[q] * GCA_STAT_TYPES;
          sum[b + ti + 1] += tc->room[ti][q];
          sum[b + GCA_STAT_ALL] += tc->room[ti][q];
        }
      }
    }
  }
  for (int i = 0; i < GCA__TC_NSTATS; i++) {
    if (sum[i] != d->tc_esc[i])
      return gca__error(GCA_ERR_INTERNAL,
                        "allocator_check: device %d: headroom for statistic %d counted %" PRId64
                        ", the thread caches hold %" PRId64,
                        d->device, i, d->tc_esc[i], sum[i]);
    if (d->tc_esc[i] > 0 && room(d, i / GCA_STAT_TYPES, i % GCA_STAT_TYPES) < 0)
      return gca__error(GCA_ERR_INTERNAL,
                        "allocator_check: device %d: statistic %d with the headroom held "
                        "could pass its peak unseen",
                        d->device, i);
  }
  return GCA_OK;
}
