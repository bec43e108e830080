/* SPDX-License-Identifier: Apache-2.0 */
/* tcache.h - the thread caches (Note [Thread caches], tcache.c): a thread's
 * cache of one device, its lock, and the two fast paths that run without the
 * device lock (the take of a cached block and the put of a block the cache
 * handed out), inline for the entry points of allocator.c; the locked side
 * (tcache.c) and the statistics side (tcstats.c) below them.
 */
#ifndef GCA_TCACHE_H
#define GCA_TCACHE_H

#include "alloc_core.h"
#include "history.h"

#define GCA__TC_BINS     16                 /* bins per thread cache, a power of two */
#define GCA__TC_BIN_MAX  8                  /* blocks per bin */
#define GCA__TC_DOMAIN   64                 /* blocks a thread cache holds, cached or handed out */
#define GCA__TC_SLOTS    128                /* its table: twice the domain, a power of two */
#define GCA__TC_MAX_SIZE ((size_t)8 << 20)  /* the largest block it takes */
#define GCA__TC_BYTES    ((size_t)32 << 20) /* bytes it may keep cached */
/* Note [Thread cache waste]: a cached block evicted unused adds one to its
 * cache's waste, a hit takes GCA__TC_HIT_PAYS off; at GCA__TC_WASTE_OFF the
 * cache is parked, and the thread tries one again after GCA__TC_PROBE frees,
 * twice as many after each try that went unused. */
#define GCA__TC_WASTE_OFF 8
#define GCA__TC_HIT_PAYS  8
#define GCA__TC_PROBE     256 /* frees before a parked cache is tried again, */
#define GCA__TC_BACKOFF   8   /* doubled per unused try up to 2^8 times that */

/* What a thread cache's paths change, per statistic type: allocation (and
 * active), allocated_bytes (and active_bytes), requested_bytes,
 * inactive_split, inactive_split_bytes. */
enum {
  GCA__TQ_BLOCKS,
  GCA__TQ_BYTES,
  GCA__TQ_REQUESTED,
  GCA__TQ_SPLIT,
  GCA__TQ_SPLIT_BYTES,
  GCA__TQ
};

/* A bin: the cached blocks of one (stream, size), newest last. */
typedef struct gca__tcbin {
  gca_stream_t stream;
  size_t size;
  uint32_t n;
  gca__block_t *blk[GCA__TC_BIN_MAX];
} gca__tcbin_t;

/* A thread's cache of device d (Note [Thread caches]). `lock` orders the
 * owner's fast paths against device-lock holders that visit (a fold, an
 * eviction, a walk); under d->lock the owner itself needs no lock for it.
 * The fast paths write nothing but this structure: a block's requested size
 * while handed out is kept here (req), not in the block record, whose cache
 * lines other threads' records may share.
 * For each type index ti (0 small, 1 large) and quantity q:
 *   room >= 0: what is left of its headroom; a move of n (either sign)
 *     needs n <= room and takes n off it, so a fast path checks and
 *     counts the move with one subtraction
 *   base: room at the last fold, so delta = base - room is how far the
 *     statistic moved since, and allow = room + delta = base its headroom
 *     (what it gave back before, and may take again)
 *   up: the sum of its rises since the last fold (allocated), its falls
 *     (freed) being up - delta; a fall is counted in room alone
 * Invariants: ncached == blocks in the bins, cached_bytes their bytes, but
 * for a streak's block that is out, which both still count until the streak
 * is settled (Note [Thread cache streaks]: only too high, never too low);
 * ndomain == entries of the table == blocks whose ->tc is this cache; a
 * block of the domain is cached exactly when its req is 0 (a request is
 * never of 0 bytes). */
struct gca__tcache {
  atomic_uint lock;     /* 0 free, 1 held: a futex word (Note [Thread cache lock]) */
  atomic_uint sleepers; /* threads that may be asleep on `lock` */
  /* Note [Thread cache sections]: `quiet` GCA__TC_QUIET, the owner's fast
   * paths run in a section (`active`) instead of taking `lock`; a visitor
   * holding `lock` sets it GCA__TC_BLOCKED, fences every thread
   * (membarrier), waits for `active` to drop and sets it 0. `calm` counts
   * the owner's locked fast paths since; written under `lock` (calm: by the
   * owner). */
  atomic_uint quiet, active;
  uint32_t calm;
  uint64_t owner;     /* gca__t_tc_id of the thread whose cache it is */
  gca__devalloc_t *d; /* NULL once the device is gone; written under `lock` */
  int64_t up[2][GCA__TQ], base[2][GCA__TQ], room[2][GCA__TQ];
  gca__tcbin_t bins[GCA__TC_BINS];
  /* blocks in the bins: atomic so that the owner's fast take may look
   * without the lock (only the owner adds, so its look is never low); every
   * write is under the lock (gca__tc_ncached_add) */
  atomic_size_t ncached;
  size_t cached_bytes, ndomain;
  /* Note [Thread cache waste]: written under the device lock and tc's lock,
   * or by the owner (under either); `lost` counts the blocks it wasted, and
   * `probing` says it was taken back from the parked ones */
  uint8_t waste;
  bool probing;
  uint32_t lost;
  /* bit (home slot / 2) set for each block of the domain (and maybe for some
   * that left): a free whose bit is clear is none of tc's, found without its
   * lock. Set by the owner only; cleared when the domain empties. */
  atomic_uint_fast64_t filter;
  /* Note [Thread cache streaks]: the block whose pairs the owner repeats
   * (NULL: none), its address, the requested size of the streak, whether it
   * is out now (its take's moves owed), and the pairs whose rises are owed to
   * up. Written by the owner's fast paths, or under `lock` (gca__tc_settle_hot);
   * `hot` is atomic (relaxed) so that the owner may look at it before it
   * enters the cache. */
  _Atomic(gca__block_t *) hot;
  gca_devptr_t hot_addr;
  size_t hot_req;
  int64_t hot_pairs;
  bool hot_out;
  gca_devptr_t keys[GCA__TC_SLOTS]; /* its domain by address; 0 = empty */
  gca__block_t *vals[GCA__TC_SLOTS];
  size_t req[GCA__TC_SLOTS];
  gca__tcache_t *prev, *next; /* d->tcs, under d->lock */
};

/* A thread's caches, one per device; its lifetime is the thread's. A cache
 * that wasted its blocks is parked (Note [Thread cache waste]): out of its
 * device, kept for reuse, while `probe` counts down the frees until the
 * thread tries a cache again. */
typedef struct gca__tthread {
  gca__tcache_t *dev[GCA__MAX_DEVICES];
  gca__tcache_t *parked[GCA__MAX_DEVICES];
  uint64_t inst[GCA__MAX_DEVICES]; /* the allocator it was parked on (gca__devalloc_t.inst): one
                                      made since (a reset) finds the thread unparked */
  uint32_t probe[GCA__MAX_DEVICES];
  uint8_t backoff[GCA__MAX_DEVICES]; /* probes in a row that went unused */
} gca__tthread_t;

extern _Thread_local gca__tthread_t *gca__t_tc __attribute__((tls_model("initial-exec")));

/* The contended side of a thread cache's lock (tcache.c): a short spin, then
 * sleeps of at most GCA__TC_NAP_NS on its word (Note [Thread cache lock]). */
void gca__tc_lock_slow(gca__tcache_t *tc);
/* Lets go tc's lock from the locked side, waking a visitor or owner asleep
 * on it, and lets the owner's sections in again. */
void gca__tc_unlock_wake(gca__tcache_t *tc);
/* With tc's lock held and tc quiet: unless the caller owns tc, keeps the
 * owner's sections out (Note [Thread cache sections]). */
void gca__tc_block(gca__tcache_t *tc);
/* Its parts, for a visitor of many caches (one fence for all): marks tc
 * blocked when it is quiet and not the caller's (true then); the fence on
 * every thread; the wait for a blocked cache's section to end, after which
 * tc is no longer quiet. */
bool gca__tc_blocks(gca__tcache_t *tc);
void gca__tc_fence_all(void);
void gca__tc_wait_out(gca__tcache_t *tc);
/* tc's lock alone (gca__tc_lock_all blocks the sections of many at once). */
static inline void gca__tc_lock_raw(gca__tcache_t *tc) {
  unsigned expected = 0;
  if (GCA_UNLIKELY(!atomic_compare_exchange_strong_explicit(
          &tc->lock, &expected, 1, memory_order_acquire, memory_order_relaxed)))
    gca__tc_lock_slow(tc);
}

/* Adds n to tc->ncached (tc's lock held, or the caller its owner under d->lock). */
static inline void gca__tc_ncached_add(gca__tcache_t *tc, int n) {
  atomic_store_explicit(&tc->ncached,
                        atomic_load_explicit(&tc->ncached, memory_order_relaxed) + (size_t)n,
                        memory_order_relaxed);
}

/* n if it is a rise, else 0, without a branch. */
static inline int64_t gca__tc_rise(int64_t n) {
  return n & ~(n >> 63);
}

/* The moves of a fast take of a block of `bytes` for `req` whose run's
 * inactive_split changes by (split, split_bytes) when it is cached: one
 * allocated block, and that change undone. Each room next to its rises:
 * stores of neighbouring counters in one line of code are paired into vector
 * instructions that cost more. */
static inline __attribute__((always_inline)) void gca__tc_take_moves(int64_t *room, int64_t *up,
                                                                     int64_t bytes, int64_t req,
                                                                     int64_t split,
                                                                     int64_t split_bytes) {
  room[GCA__TQ_BLOCKS] -= 1;
  up[GCA__TQ_BLOCKS] += 1;
  room[GCA__TQ_BYTES] -= bytes;
  up[GCA__TQ_BYTES] += bytes;
  room[GCA__TQ_REQUESTED] -= req;
  up[GCA__TQ_REQUESTED] += req;
  room[GCA__TQ_SPLIT] += split;
  up[GCA__TQ_SPLIT] += gca__tc_rise(-split);
  room[GCA__TQ_SPLIT_BYTES] += split_bytes;
  up[GCA__TQ_SPLIT_BYTES] += gca__tc_rise(-split_bytes);
}

/* Note [Thread cache streaks]: applies what the streak owes tc's counters
 * (its pairs' rises, and the take of a block that is out) and ends it. The
 * owner's fast paths call it before any other move; every other reader
 * holds tc's lock (gca__tc_lock, gca__tc_lock_all, gca__tc_fold_one). */
static inline void gca__tc_settle_hot(gca__tcache_t *tc) {
  gca__block_t *b = atomic_load_explicit(&tc->hot, memory_order_relaxed);
  if (b == NULL)
    return;
  int64_t k = tc->hot_pairs, bytes = (int64_t)b->size, req = (int64_t)tc->hot_req;
  int64_t split = b->fc_blocks, split_bytes = b->fc_bytes;
  int64_t *room = tc->room[b->tc_ti], *up = tc->up[b->tc_ti];
  up[GCA__TQ_BLOCKS] += k;
  up[GCA__TQ_BYTES] += k * bytes;
  up[GCA__TQ_REQUESTED] += k * req;
  up[GCA__TQ_SPLIT] += k * (gca__tc_rise(split) + gca__tc_rise(-split));
  up[GCA__TQ_SPLIT_BYTES] += k * (gca__tc_rise(split_bytes) + gca__tc_rise(-split_bytes));
  if (tc->hot_out) { /* the moves of gca__tc_take, and its counts */
    gca__tc_ncached_add(tc, -1);
    tc->cached_bytes -= b->size;
    gca__tc_take_moves(room, up, bytes, req, split, split_bytes);
  }
  atomic_store_explicit(&tc->hot, NULL, memory_order_relaxed);
  tc->hot_addr = 0;
  tc->hot_out = false;
  tc->hot_pairs = 0;
}

/* The lock of a thread cache (Note [Thread cache lock]): the owner tries it
 * for each fast path of a cache that is not quiet (gca__tc_enter: its own
 * cache line, so uncontended it costs one atomic instruction and a plain
 * store), the locked side takes it (a device-lock holder when it visits, or
 * the owner under d->lock), and a visitor keeps a quiet cache's sections
 * out (Note [Thread cache sections]). */
static inline void gca__tc_lock(gca__tcache_t *tc) {
  gca__tc_lock_raw(tc);
  if (GCA_UNLIKELY(atomic_load_explicit(&tc->quiet, memory_order_relaxed)))
    gca__tc_block(tc);
  gca__tc_settle_hot(tc);
}
/* Note [Thread cache sections]: whether sections may be used at all (the
 * process registered for membarrier, and the build is not one a thread
 * sanitizer checks, which cannot see the asymmetric fence); and how many
 * locked fast paths in a row, with no visit, make a cache quiet. */
#if defined(__SANITIZE_THREAD__)
#define GCA__TC_SECTIONS_BUILD 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GCA__TC_SECTIONS_BUILD 0
#endif
#endif
#ifndef GCA__TC_SECTIONS_BUILD
#define GCA__TC_SECTIONS_BUILD 1
#endif
#define GCA__TC_CALM 4096
extern uint32_t gca__tc_calm_limit; /* GCA__TC_CALM, or UINT32_MAX without sections */

/* tcache.quiet: the lock, sections, or sections a visitor is keeping out. */
enum { GCA__TC_LOUD = 0, GCA__TC_QUIET = 1, GCA__TC_BLOCKED = 2 };
/* How a fast path holds its cache: not at all (a miss), in a section, or by its lock. */
enum { GCA__TC_OUT = 0, GCA__TC_SECTION = 1, GCA__TC_LOCKED = 2 };

/* The fast paths' entry (Note [Thread cache sections]): a quiet cache is
 * entered with a load, a plain store, a compiler barrier and a second load;
 * else its lock is tried, and GCA__TC_OUT (a miss) when a visitor holds it
 * (a blocked cache's visitor does). It calls nothing, so the paths save no
 * register. */
static inline int gca__tc_enter(gca__tcache_t *tc) {
  if (GCA__TC_SECTIONS_BUILD &&
      GCA_LIKELY(atomic_load_explicit(&tc->quiet, memory_order_relaxed) == GCA__TC_QUIET)) {
    atomic_store_explicit(&tc->active, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst); /* a fence once a visitor runs membarrier */
    if (GCA_LIKELY(atomic_load_explicit(&tc->quiet, memory_order_acquire) == GCA__TC_QUIET))
      return GCA__TC_SECTION;
    atomic_store_explicit(&tc->active, 0, memory_order_release);
    return GCA__TC_OUT;
  }
  unsigned expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&tc->lock, &expected, 1, memory_order_acquire,
                                               memory_order_relaxed))
    return GCA__TC_OUT;
  if (GCA_UNLIKELY(++tc->calm >= gca__tc_calm_limit)) {
    if (gca__tc_calm_limit != UINT32_MAX)
      atomic_store_explicit(&tc->quiet, GCA__TC_QUIET, memory_order_relaxed); /* by the unlock */
    else
      tc->calm = 0; /* no sections: the count only wraps */
  }
  return GCA__TC_LOCKED;
}
/* The fast paths' exit: no wake-up (a sleeper wakes by its own timeout). */
static inline void gca__tc_exit(gca__tcache_t *tc, int how) {
  if (how == GCA__TC_SECTION)
    atomic_store_explicit(&tc->active, 0, memory_order_release);
  else
    atomic_store_explicit(&tc->lock, 0, memory_order_release);
}

/* The calling thread's cache of `device`, or NULL (it may be dead: ->d). */
static inline gca__tcache_t *gca__tc_mine(int device) {
  gca__tthread_t *t = gca__t_tc;
  return t != NULL ? t->dev[device] : NULL;
}

static inline uint32_t gca__tc_bin_index(gca_stream_t stream, size_t size) {
  uint64_t h = ((uint64_t)(uintptr_t)stream ^ (size >> 9)) * 0x9e3779b97f4a7c15ull;
  return (uint32_t)(h >> (64 - 4));
}
static inline gca__tcbin_t *gca__tc_bin(gca__tcache_t *tc, gca_stream_t stream, size_t size) {
  return &tc->bins[gca__tc_bin_index(stream, size)];
}
_Static_assert(GCA__TC_BINS == 16, "gca__tc_bin takes 4 bits of the hash");

static inline uint32_t gca__tc_slot(gca_devptr_t addr) {
  return (uint32_t)(((addr >> 9) * 0x9e3779b97f4a7c15ull) >> (64 - 7));
}
_Static_assert(GCA__TC_SLOTS == 128, "gca__tc_slot takes 7 bits of the hash");

/* The slot of tc's table holding addr, or -1. */
static inline int gca__tc_find(const gca__tcache_t *tc, gca_devptr_t addr) {
  for (uint32_t i = gca__tc_slot(addr);; i = (i + 1) & (GCA__TC_SLOTS - 1)) {
    if (tc->keys[i] == addr)
      return (int)i;
    if (tc->keys[i] == 0)
      return -1;
  }
}

/* Whether b, of tc's domain, is cached in its bin (tc's lock held). */
static inline bool gca__tc_in_bin(const gca__tcbin_t *bin, const gca__block_t *b) {
  for (uint32_t i = 0; i < bin->n; i++)
    if (bin->blk[i] == b)
      return true;
  return false;
}

/* Whether the thread caches' fast paths may run on d now: on, nothing
 * pending, no request routed to a private pool, no history recorded (all in
 * the gate, Note [Leaf gate]). */
static inline bool gca__tc_open(gca__devalloc_t *d) {
  return atomic_load_explicit(&d->tc_gate, memory_order_relaxed) == 0;
}

/* Note [Thread cache streaks]: the streak's take of its block h, on top of
 * its bin (n blocks), for `size` bytes: its moves owed. tc entered. */
static inline __attribute__((always_inline)) void
gca__tc_take_hot(gca__tcache_t *tc, gca__block_t *h, gca__tcbin_t *bin, uint32_t n, size_t size) {
  bin->n = n - 1;
  tc->req[h->tc_slot] = size;
  tc->hot_out = true; /* ncached and cached_bytes still count h: owed */
  if (GCA_UNLIKELY(tc->waste != 0))
    tc->waste = tc->waste > GCA__TC_HIT_PAYS ? (uint8_t)(tc->waste - GCA__TC_HIT_PAYS) : 0;
}

/* The streak's put of the block at addr, when it is the one out: back on
 * top of its bin, as the take left it; false otherwise. tc entered. */
static inline __attribute__((always_inline)) bool
gca__tc_put_hot(gca__devalloc_t *d, gca__tcache_t *tc, gca_devptr_t addr) {
  if (addr != tc->hot_addr || !tc->hot_out || GCA_UNLIKELY(tc->d != d))
    return false;
  gca__block_t *h = atomic_load_explicit(&tc->hot, memory_order_relaxed);
  gca__tcbin_t *bin = &tc->bins[h->tc_bin];
  tc->req[h->tc_slot] = 0;
  /* the take only lowered n, and nothing moved the bin since: h is still in
   * the slot above the top */
  GCA_ASSERT_DEBUG(bin->n < GCA__TC_BIN_MAX && bin->blk[bin->n] == h);
  bin->n++;
  tc->hot_out = false;
  tc->hot_pairs++;
  return true;
}

/* Note [Leaf hits] (allocator.c): the streak's take for `size` bytes on
 * `stream`, entering tc only when a streak may be there; the block, or NULL
 * with nothing done. Calls nothing. */
static inline __attribute__((always_inline)) gca__block_t *
gca__tc_leaf_take(gca__devalloc_t *d, gca__tcache_t *tc, size_t size, gca_stream_t stream) {
  /* a look at `hot` first: without a streak the cache is entered once, later */
  if (atomic_load_explicit(&tc->hot, memory_order_relaxed) == NULL || !gca__tc_open(d))
    return NULL;
  int how = gca__tc_enter(tc);
  if (how == GCA__TC_OUT)
    return NULL;
  gca__block_t *h = atomic_load_explicit(&tc->hot, memory_order_relaxed);
  if (h != NULL && !tc->hot_out && size == tc->hot_req && gca__stream_keyed(h->stream, stream) &&
      tc->d == d) {
    /* while a streak lasts its block is on top of its bin: whatever else
     * moves a bin settles the streak first (Note [Thread cache streaks]) */
    gca__tcbin_t *bin = &tc->bins[h->tc_bin];
    uint32_t n = bin->n;
    GCA_ASSERT_DEBUG(n != 0 && bin->blk[n - 1] == h);
    gca__tc_take_hot(tc, h, bin, n, size);
    gca__tc_exit(tc, how);
    return h;
  }
  gca__tc_exit(tc, how);
  return NULL;
}

/* Note [Leaf hits]: the streak's put of the block at addr, as
 * gca__tc_leaf_take; false with nothing done when it is not the streak's. */
static inline __attribute__((always_inline)) bool
gca__tc_leaf_put(gca__devalloc_t *d, gca__tcache_t *tc, gca_devptr_t addr) {
  if (atomic_load_explicit(&tc->hot, memory_order_relaxed) == NULL || !gca__tc_open(d))
    return false;
  int how = gca__tc_enter(tc);
  if (how == GCA__TC_OUT)
    return false;
  bool done = gca__tc_put_hot(d, tc, addr);
  gca__tc_exit(tc, how);
  return done;
}

/* The fast take: the newest cached block of exactly (stream, rounded size)
 * in tc, handed out for `size` bytes, or NULL (nothing there, or the
 * statistics it moves need more headroom than tc has). The gate is open, so
 * rounding needs no setting. */
static inline __attribute__((always_inline)) gca__block_t *
gca__tc_take(gca__devalloc_t *d, gca__tcache_t *tc, gca_stream_t stream, size_t size) {
  size_t rounded = gca__round_plain(size);
  unsigned ti = rounded > GCA__SMALL_SIZE; /* the default pool's type index */
  gca__tcbin_t *bin = gca__tc_bin(tc, stream, rounded);
  if (atomic_load_explicit(&tc->ncached, memory_order_relaxed) == 0)
    return NULL; /* nothing cached: the cache is not entered */
  int how = gca__tc_enter(tc);
  if (GCA_UNLIKELY(how == GCA__TC_OUT))
    return NULL; /* a visitor's: the locked path waits for it */
  gca__block_t *b;
  uint32_t n = bin->n;
  if (GCA_UNLIKELY(tc->d != d || n == 0 || bin->stream != stream || bin->size != rounded ||
                   (b = bin->blk[n - 1])->tc_ti != ti))
    goto miss;
  if (b == atomic_load_explicit(&tc->hot, memory_order_relaxed) &&
      size == tc->hot_req) { /* the streak's take: its moves owed */
    gca__tc_take_hot(tc, b, bin, n, size);
    gca__tc_exit(tc, how);
    return b;
  }
  gca__tc_settle_hot(tc);
  /* the moves: one allocated block of `bytes` for `size`, and the run's
   * change in inactive_split undone; any room going below zero misses */
  int64_t split = b->fc_blocks, split_bytes = b->fc_bytes, bytes = (int64_t)rounded;
  int64_t *room = tc->room[ti], *up = tc->up[ti];
  if (GCA_UNLIKELY(room[GCA__TQ_BLOCKS] < 1 || room[GCA__TQ_BYTES] < bytes ||
                   room[GCA__TQ_REQUESTED] < (int64_t)size || room[GCA__TQ_SPLIT] < -split ||
                   room[GCA__TQ_SPLIT_BYTES] < -split_bytes))
    goto miss;
  bin->n = n - 1;
  tc->req[b->tc_slot] = size;
  gca__tc_ncached_add(tc, -1);
  tc->cached_bytes -= rounded;
  if (GCA_UNLIKELY(tc->waste != 0))
    tc->waste = tc->waste > GCA__TC_HIT_PAYS ? (uint8_t)(tc->waste - GCA__TC_HIT_PAYS) : 0;
  gca__tc_take_moves(room, up, bytes, (int64_t)size, split, split_bytes);
  gca__tc_exit(tc, how);
  return b;
miss:
  gca__tc_exit(tc, how);
  return NULL;
}

/* The fast put: the block at addr, handed out by tc and live, goes back
 * into its bin; false (nothing done) when it is not tc's, the bin is taken or
 * full, or the statistics need more headroom than tc has. */
static inline __attribute__((always_inline)) bool gca__tc_put(gca__devalloc_t *d, gca__tcache_t *tc,
                                                              gca_devptr_t addr) {
  if (!(atomic_load_explicit(&tc->filter, memory_order_relaxed) &
        (UINT64_C(1) << (gca__tc_slot(addr) >> 1))))
    return false; /* not tc's: the cache is not entered */
  int how = gca__tc_enter(tc);
  if (GCA_UNLIKELY(how == GCA__TC_OUT))
    return false; /* a visitor's: the locked path waits for it */
  if (gca__tc_put_hot(d, tc, addr)) {
    gca__tc_exit(tc, how);
    return true;
  }
  gca__tc_settle_hot(tc);
  int slot = gca__tc_find(tc, addr);
  if (GCA_UNLIKELY(tc->d != d || slot < 0))
    goto miss;
  gca__block_t *b = tc->vals[slot];
  gca__tcbin_t *bin = &tc->bins[b->tc_bin];
  int64_t req = (int64_t)tc->req[slot], bytes = (int64_t)b->size;
  uint32_t n = bin->n;
  if (GCA_UNLIKELY((n != 0 && (bin->stream != b->stream || bin->size != (size_t)bytes)) ||
                   n == GCA__TC_BIN_MAX || tc->cached_bytes + (size_t)bytes > GCA__TC_BYTES ||
                   req == 0)) /* the last: cached, a double free the locked path reports */
    goto miss;
  /* the moves: one block of `bytes` for `req` freed, and the run's change
   * in inactive_split; falls need no room, and count in room alone */
  int64_t split = b->fc_blocks, split_bytes = b->fc_bytes;
  int64_t *room = tc->room[b->tc_ti], *up = tc->up[b->tc_ti];
  int64_t r_split = room[GCA__TQ_SPLIT] - split,
          r_split_bytes = room[GCA__TQ_SPLIT_BYTES] - split_bytes;
  if (GCA_UNLIKELY((r_split | r_split_bytes) < 0))
    goto miss;
  room[GCA__TQ_BLOCKS] += 1;
  room[GCA__TQ_BYTES] += bytes;
  room[GCA__TQ_REQUESTED] += req;
  room[GCA__TQ_SPLIT] = r_split;
  up[GCA__TQ_SPLIT] += gca__tc_rise(split); /* apart: see gca__tc_take_moves */
  room[GCA__TQ_SPLIT_BYTES] = r_split_bytes;
  tc->req[slot] = 0;
  up[GCA__TQ_SPLIT_BYTES] += gca__tc_rise(split_bytes);
  bin->stream = b->stream;
  bin->size = (size_t)bytes;
  bin->blk[n] = b;
  bin->n = n + 1;
  gca__tc_ncached_add(tc, 1);
  tc->cached_bytes += (size_t)bytes;
  atomic_store_explicit(&tc->hot, b, memory_order_relaxed); /* a streak may start */
  tc->hot_addr = addr;
  tc->hot_req = (size_t)req;
  gca__tc_exit(tc, how);
  return true;
miss:
  gca__tc_exit(tc, how);
  return false;
}

/* Whether live block b's free might enter a thread cache (d->lock held):
 * then the free takes the locked path, which tries (gca__tc_try_enter). */
static inline bool gca__tc_wants(const gca__devalloc_t *d, const gca__block_t *b) {
  return d->tc_on && b->size <= GCA__TC_MAX_SIZE && !b->seg->expandable;
}

/* ---- tcache.c (every entry with d->lock held) ---- */

/* Notes the calling thread on a locked path; a second thread engages the
 * thread caches (Note [Thread caches]: one thread is served by the free cache). */
void gca__tc_note_thread_slow(gca__devalloc_t *d);
extern _Thread_local uint64_t gca__t_tc_id __attribute__((tls_model("initial-exec")));
static inline void gca__tc_note_thread(gca__devalloc_t *d) {
  if (GCA_UNLIKELY(!d->tc_engaged) && (gca__t_tc_id == 0 || d->tc_thread != gca__t_tc_id))
    gca__tc_note_thread_slow(d);
}
/* Recomputes d->tc_on and the gate after a setting changed; `reset`: every
 * thread cache gives back its blocks (the rules they were taken under may
 * have changed). */
void gca__tc_update(gca__devalloc_t *d, bool reset);
/* The free of live block b (not in a domain, events processed) by the
 * calling thread: enters its cache when it may (Note [Thread caches]);
 * true when it did. */
bool gca__tc_try_enter(gca__devalloc_t *d, gca__block_t *b);
/* Parks the calling thread's cache of d, which wasted its entries (Note
 * [Thread cache waste]). */
void gca__tc_park_mine(gca__devalloc_t *d);
/* Whether the calling thread takes no free into a cache of d now: its cache
 * wasted its entries and is parked (here, if it was not yet), and the probe
 * count has not run out (it does at 1: the next try may make a cache).
 * Counts the free. Inline: a parked thread's every free asks. */
static inline bool gca__tc_skips(gca__devalloc_t *d) {
  gca__tthread_t *t = gca__t_tc;
  if (t == NULL)
    return false;
  gca__tcache_t *tc = t->dev[d->device];
  if (tc != NULL && tc->d == d) {
    if (GCA_LIKELY(tc->waste < GCA__TC_WASTE_OFF))
      return false;
    gca__tc_park_mine(d);
    return true;
  }
  if (t->probe[d->device] <= 1 || t->inst[d->device] != d->inst)
    return false;
  t->probe[d->device]--;
  return true;
}
/* Whether the calling thread's cache takes no free now, known without
 * reading the block: parked (gca__tc_skips, which counts the free), or its
 * domain full. */
static inline bool gca__tc_declines(gca__devalloc_t *d) {
  if (gca__tc_skips(d))
    return true;
  gca__tcache_t *tc = gca__tc_mine(d->device);
  return tc != NULL && tc->d == d && tc->ndomain >= GCA__TC_DOMAIN;
}
/* Note [Leaf hits]: gca__tc_declines for a leaf, calling nothing, for a
 * thread with no cache of d (gca__tc_mine NULL): true when its cache is
 * parked and its next probe not due, the free then counted with
 * gca__tc_leaf_skip; false when the full path must decide (no thread record
 * yet: that free may make its cache; or the probe is due). */
static inline bool gca__tc_leaf_declines(const gca__devalloc_t *d) {
  gca__tthread_t *t = gca__t_tc;
  return t != NULL && t->dev[d->device] == NULL && t->probe[d->device] > 1 &&
         t->inst[d->device] == d->inst;
}
static inline void gca__tc_leaf_skip(const gca__devalloc_t *d) {
  gca__t_tc->probe[d->device]--;
}
/* A take from the calling thread's cache under the lock, with the
 * statistics counted here; NULL when it holds no such block. */
gca__block_t *gca__tc_take_locked(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                  size_t rounded, size_t size);
/* Takes block b (->tc set) out of its domain: false when it is cached there
 * (not live: nothing done), else it is a plain allocated block now. */
bool gca__tc_claim(gca__devalloc_t *d, gca__block_t *b);
/* Whether b (->tc set) is live: handed out, not cached. */
bool gca__tc_live(gca__block_t *b);
/* Whether b (->tc set) is cached, and its requested size (0 when cached):
 * the caller holds b->tc's lock. */
bool gca__tc_cached(const gca__block_t *b);
size_t gca__tc_requested(const gca__block_t *b);
/* Takes b (->tc set) out of its domain; cached, it goes back to the free
 * tree merged with its free neighbours (the statistics already count it so). */
void gca__tc_evict(gca__devalloc_t *d, gca__block_t *b);
/* Before free block b (in the tree) is made active: a thread cache's block
 * next to it leaves its domain. True when one went back to the tree (b may
 * have merged into it: search again). */
bool gca__tc_clear_near(gca__devalloc_t *d, gca__block_t *b);
/* Evicts every cached block of (pool, stream) from every thread cache (a
 * request found nothing that fits); returns how many. */
size_t gca__tc_flush_stream(gca__devalloc_t *d, const gca__pool_t *pool, gca_stream_t stream);
/* Evicts every cached block of every thread cache (release, snapshots);
 * with `detach`, the blocks handed out leave the domains too. */
void gca__tc_flush_all(gca__devalloc_t *d, bool detach);
/* Marks every thread cache of d dead (allocator teardown; d is unreachable). */
void gca__tc_destroy_all(gca__devalloc_t *d);

/* ---- tcstats.c (every entry with d->lock held) ---- */

/* Takes (lets go) the lock of every thread cache of d, in list order. */
void gca__tc_lock_all(gca__devalloc_t *d);
void gca__tc_unlock_all(gca__devalloc_t *d);
/* Folds every thread cache's deltas into d->stats, and takes back the
 * headroom of the quantities in `revoke` (a mask of 1 << GCA__TQ_*); the
 * caller holds every thread cache's lock. */
void gca__tc_fold_locked(gca__devalloc_t *d, unsigned revoke);
/* The same, taking and letting go the locks; d->stats is exact after it. */
void gca__tc_fold(gca__devalloc_t *d, unsigned revoke);
/* Folds tc alone (its lock held, or the caller its owner), taking back the
 * headroom of the quantities in `revoke`. */
void gca__tc_fold_one(gca__devalloc_t *d, gca__tcache_t *tc, unsigned revoke);
/* Checks the headroom bookkeeping (the walker; every thread cache locked and folded). */
gca_status_t gca__tc_check_escrow(const gca__devalloc_t *d);

#endif
