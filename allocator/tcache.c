/* SPDX-License-Identifier: Apache-2.0 */
/* tcache.c - the thread caches: per (thread, device), the blocks a thread
 * freed wait in its own (stream, size) bins, and its next request of that
 * size takes one back, both without the device lock. This file holds the
 * locked side: a block entering a cache, the take under the lock, a block
 * leaving a cache (claimed by another thread's free, evicted beside a change,
 * flushed), and the caches' lives (created on a thread's first cached free,
 * given back at thread exit, marked dead with their device). tcache.h holds
 * the fast paths; tcstats.c the statistics.
 *
 * Note [Thread caches]. With one lock per device, two threads allocating on
 * two cores hand the lock's cache line, and every line of the device state a
 * pair touches, back and forth on each operation: the free cache's pair
 * (Note [Free cache]) costs ~50 ns on one thread and ~1 us on two. So once a
 * second thread has used a device (one thread keeps the free cache, which
 * needs no table), each thread frees into a cache of its own and takes back
 * from it with no write to anything another thread touches: its cache's lock
 * (one cache line, uncontended), its bins, its counters, the block.
 *
 * The domain. A thread cache holds up to GCA__TC_DOMAIN blocks, found by
 * address in its table: each is cached (in a bin, free for the statistics) or
 * handed out (live). For the allocator's structures a block of a domain is
 * allocated throughout: it is in the pointer map and in no tree, and nothing
 * under the device lock merges with it, splits it or releases it, so the
 * fast paths may flip it between cached and handed out under the cache's
 * lock alone. A block enters a domain on a locked free by its thread
 * (gca__tc_try_enter) under the free cache's rules: a plain block of a
 * default pool, in a classic segment, no larger than GCA__TC_MAX_SIZE, with no
 * held block (cached in the free cache or in a domain) within two places, so
 * its logical free run is {prev if free, b, next if free} and fc_blocks and
 * fc_bytes, computed then, give what it changes in inactive_split (with the
 * recycle bins on, a run of its own instead: Note [Thread cache runs]). It leaves
 * the domain (under the device lock and the cache's lock) when:
 * - anything about to change that run looks first: a free completing beside
 *   it (gca__fcache_evict_near), a free block beside it made active
 *   (gca__tc_clear_near, before the split); a cached block goes back to the
 *   tree, merged as the statistics already count it; a handed-out one is just
 *   let go (its next free takes the locked path);
 * - another thread frees it, or any lookup of a live pointer finds it
 *   (record_stream, pointer_info, IPC): gca__tc_claim, so a block with
 *   recorded streams never takes a fast path;
 * - a request finds nothing that fits (its stream's cached blocks go back
 *   first, so cached blocks never cost a segment), empty_cache and the
 *   out-of-memory remedies, snapshots, and any change of setting (everything).
 * The free cache (Note [Free cache]: one slot per (stream, default pool),
 * hits only where the tree's best fit agrees) and the domains never hold the
 * same block: gca__fc_cacheable refuses a block of a domain, a block enters a
 * domain and the free cache's put (gca__fc_fits) takes a block only with no
 * held block of either kind near, and a free a thread cache may take
 * (gca__tc_wants) goes the locked way, where the domain is tried before the
 * slot. A locked request tries its thread cache, then its slot; a miss evicts
 * its slot (gca__fcache_evict_slot) and take_fit gives back the stream's
 * thread-cached blocks only when the tree has nothing that fits.
 * The fast paths run only while the device's gate is open: the caches are on
 * (engaged, thread_cache and the free cache on, no rounding divisions), no
 * free waits for events or a capture, no request is routed to a private pool
 * (d->routing: captures, scopes, filters) and no history is recorded, all
 * of it one word, d->tc_gate, that every holder of the device lock brings up
 * to date as it lets go (Note [Leaf gate], fcache.h); else everything goes the
 * locked way, where routing, pending frees and history are handled as before.
 *
 * Statistics stay exact (tcstats.c). A cache keeps what its fast paths move,
 * per type and quantity (blocks, bytes, requested bytes, inactive_split and
 * its bytes): delta, how far each moved since its last fold (its headroom
 * left then less now), and the rises among its moves. The current of a
 * statistic is d->stats' plus every cache's delta; a read (gca_get_stats,
 * snapshots, the walker, reset of peaks or counters, the OOM report, trace
 * observers) takes
 * the device lock, then every cache's lock, and folds the deltas in, so it
 * sees one instant. Peaks are kept exact by escrow. A cache may raise a
 * statistic without the lock by as much as its headroom `allow`, which is
 * what it lowered the statistic by before: a fold moves its delta into
 * d->stats and turns what it gave back into headroom (G += delta,
 * allow -= delta). With G the statistic in d->stats and P its peak,
 *     G + sum(allow) <= P   and   delta <= allow   =>   G + sum(delta) <= P:
 * the true current never passes the recorded peak unseen, and a fold keeps
 * G + sum(allow). Locked paths raise G with the headroom counted (d->tc_esc,
 * gca__stat_peak): only when G + tc_esc would pass P do they fold every cache
 * and take back that quantity's headroom (gca__stat_peak_slow), and then the
 * peak is set from the exact current. Active counts the caches' blocks like
 * allocation, and its headroom is bounded by both (Note [Active
 * statistics]). A fast path that would need more headroom than it has takes
 * the locked path, which counts the change in d->stats itself. (Headroom is
 * never granted beyond what a cache gave back: extra headroom held by one
 * thread makes the others' raises pass G + tc_esc > P and take everyone's
 * back, which on four threads cost more than the locked paths it saved.)
 *
 * Memory: a cache holds at most GCA__TC_BIN_MAX blocks of a (stream, size)
 * in each of GCA__TC_BINS bins and GCA__TC_BYTES bytes cached. A thread that
 * exits gives its caches back (pthread key destructor): its deltas are
 * folded, its cached blocks go back to the tree, its handed-out ones are let
 * go. Lock order: g_tc_mu (thread exit, teardown), then d->lock, then the
 * caches' locks in list order; a fast path holds its own cache's lock only.
 *
 * Note [Thread cache lock]. The owner's fast paths hold their cache's lock
 * (unless it is quiet: Note [Thread cache sections]) for a few dozen instructions, so a visitor (a
 * fold, an eviction, a walk, under the device lock) mostly finds it free or about to be. With more
 * runnable threads than cores, though, the owner is often preempted inside
 * its section; a waiter that spins, or calls sched_yield (which on a fair
 * scheduler hardly moves it back), keeps the core the owner needs. With 8
 * threads on 2 cores a fold waited tens of milliseconds for such an owner,
 * and the owners of the caches it had locked already waited with it,
 * spinning on their own locks. So a waiter spins GCA__TC_SPINS times, then
 * sleeps on the lock word (a futex) until woken or GCA__TC_NAP_NS pass, off
 * the run queue, so the holder gets a core. The owner's unlock stays one
 * plain store: it does not look for sleepers (that would need a store-load
 * fence on every fast path), so a visitor asleep on an owner's section
 * wakes by its timeout, once per nap. The locked side lets a cache's lock go
 * with gca__tc_unlock_wake, which looks (a sequentially consistent store,
 * then the sleepers' count, as gca__mutex_t does), so a thread asleep on it
 * wakes as soon as the visitor lets go. The owner's fast paths never wait:
 * they only try the lock (gca__tc_enter), and a visitor's hold is a miss
 * that takes the locked path, where the visitor holds the device lock
 * anyway; so the fast paths call nothing and save no register for a call.
 *
 * Note [Thread cache waste]. With the recycle bins off, a block enters a
 * domain only with no held block near, and a request that splits a free
 * block beside a cached one evicts it first (gca__tc_clear_near). So a
 * thread that alternates sizes carved from one run (the 4 KiB / 12 KiB
 * pattern: each free lands beside the block the other size left cached)
 * pays on every pair for an entry, an eviction, a merge and a split, and
 * never hits: 1.6 times the plain pair of free_cache:False (with the bins on
 * both sizes stay cached: Note [Thread cache runs]). As the free cache does
 * (Note [Free cache waste]), each cache counts the cached blocks evicted
 * unused (beside a change, or pushed out of their bin by another size), and
 * the hits that only a locked request found (its fast take missed: while
 * history is recorded, say, every path is locked), against its fast hits
 * (a parked thread's pairs then go to the bins' leaves, Note [Leaf hits]): at GCA__TC_WASTE_OFF
 * the owner's next locked free parks it: the cache is given back as a dying
 * thread's is (its deltas folded, its blocks to the tree) and kept aside,
 * so the thread has no cache of the device. Its requests and frees then go
 * the way of a thread without one (the free cache, whose own count turns it
 * off the same way, and then the plain free), and once no cache of the
 * device is left the statistics are plain again (no headroom to count):
 * the layered misses of a cache that cannot serve a pattern cost nothing.
 * After GCA__TC_PROBE frees the thread takes the parked cache back with one
 * unused block to spare: its hits keep it, a loss parks it again, and the
 * next try waits twice as many frees (up to 2^GCA__TC_BACKOFF times), so a
 * pattern that never hits pays a park and a try ever more rarely; a cache
 * that served before it wasted starts the count over. Per cache, not per
 * device: one thread's pattern does not park another's cache.
 *
 * Note [Thread cache sections]. Uncontended, the lock still costs each fast
 * path a locked compare-and-swap, about a third of a cached pair (30 ns with
 * it, 21 without). Visitors are rare next to the owner's paths, so a cache
 * whose owner has run GCA__TC_CALM fast paths in a row with no visit turns
 * quiet: its owner then enters with a plain store of `active`, a compiler
 * barrier and a second load of `quiet`, and leaves with a release store, no
 * locked instruction on either side. A visitor (any gca__tc_lock of a cache
 * that is not the caller's own) takes the lock as before, and finding the
 * cache quiet, sets `quiet` to GCA__TC_BLOCKED, runs
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which puts a full fence on
 * every core running a thread of the process, and waits for `active` to
 * drop (spinning, then naps that give a preempted owner the core). That is
 * Dekker's exchange with the owner's fence supplied by the visitor: either
 * the owner's second load sees the cache blocked (it misses and takes the
 * locked path, which waits on the device lock the visitor holds), or the
 * visitor's load after the fence sees `active` and waits. The visitor then
 * sets `quiet` to GCA__TC_LOUD and clears `calm`; the owner, whose loads
 * after the fence see one of the two, uses the lock again until it has
 * been calm for GCA__TC_CALM paths. (One word for both states: the entry's
 * second look is one load and one compare.) So one fence (microseconds)
 * buys at least GCA__TC_CALM fast paths without a locked instruction, and a
 * cache visited often (another thread freeing its blocks, folds on every
 * step) just keeps the lock. A fold locks every cache first and fences once
 * for all of them (gca__tc_lock_all). The owner taking its own cache's lock
 * under the device lock blocks nothing: it is not in a section, and every
 * visitor waits for the device lock it holds. Without the registration for
 * membarrier (an old kernel), or in a build that a thread sanitizer checks
 * (it cannot see the fence, and would report the sections as races), no
 * cache turns quiet and every path uses the lock.
 *
 * Note [Thread cache streaks]. A thread that repeats a pair of one size on
 * its stream takes and puts back the same block each time, and each take
 * and put checks and moves five rooms and rises (about eighty instructions
 * of the pair). The two cancel out but for the rises, which only count. So a
 * fast put that succeeds leaves its block as the cache's `hot` one; the next
 * fast take that finds it on top of its bin, for the same requested size,
 * hands it out with no check and no move (hot_out), and the fast put of it
 * then puts it back and counts one pair (hot_pairs). Skipping the checks is
 * sound: while a streak lasts nothing else moves the rooms (every other fast
 * path, and every visitor through gca__tc_lock, gca__tc_lock_all or a fold,
 * first settles it: gca__tc_settle_hot adds the pairs' rises and the owed
 * take, and ends it), so the rooms are what they were after the put that
 * started it, which passed the same checks the other way. The cache's
 * counts of cached blocks and bytes are owed the same way (they count the
 * block while it is out, so a look at them without the lock can only find
 * too many, never too few), and since nothing moves a bin under a streak,
 * its block stays on top of its bin and in the slot above it while out: the
 * take lowers the bin's count and the put raises it again. The pair of one
 * 4 KiB block on each of two threads fell from about 330 to 250
 * instructions, and to about 150 with the leaves and these owed counts.
 *
 * Note [Thread cache runs]. With the recycle bins on (the default), small
 * free blocks already wait unmerged (Note [Recycle bins]), and a thread
 * cache counts its blocks as the bins count theirs: a cached block is a free
 * run of its own, one inactive split block of its size unless it is its
 * segment's only block (gca__run_alone), whatever its neighbours are.
 * Nothing a neighbour does changes that count, so such a block (tc_apart)
 * is free of the rule that no held block lies within two places of another
 * (which let a thread alternating 4 KiB and 12 KiB carved from one run
 * cache only one of them, Note [Thread cache waste]): it enters beside
 * anything, a split or a free beside it passes it by (gca__held is false
 * for it, so gca__tc_clear_near and gca__fcache_evict_near leave it), and
 * only its own return to the tree counts its merge, as a free completing
 * then would (to_tree, as rb_return does), which can only lower
 * inactive_split; the free cache's blocks beside it go first, as beside a
 * binned block. With the bins off a cache keeps PyTorch's merged counts
 * and the rule. Counted apart, every put raises inactive_split and every
 * take lowers it (a block merged into a free run often moves nothing), and
 * a fast path needs room for its rises, which only the falls its cache
 * counted itself give. So the locked take of a thread's own block counts
 * its fall in inactive_split in the cache's room, as a fast take does (its
 * rises go to the device's statistics): the put after it needs no lock, and
 * its fall in allocation gives the next take its room. That is a fast
 * move's bookkeeping exactly (a fold moves the fall into the device's
 * statistics and turns it into headroom), so the peaks stay exact. An
 * entry's falls stay the device's: counted in the room they made the
 * caches hold headroom for every block that entered, and with a steady
 * live set (G at its peak) each locked rise then folded every cache to take
 * it back (gca-bench-churn with a second thread, 10^6 live with holes: 880-
 * 1,076 ns against 573-635). Two threads each alternating 4 KiB and 12 KiB
 * on its own stream went from 214-232 ns a pair per thread (both caches
 * parked, both threads on the device lock) to 43-55, and from 8.6-9.3 to
 * 36.6-46.3 Mpairs/s in all (`/tmp` loop of 5 M pairs a thread).
 */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <stdlib.h>
#include <string.h>

#include "fcache.h" /* gca__fc_run_delta */
#include "history.h"
#include "tcache.h"

_Thread_local gca__tthread_t *gca__t_tc __attribute__((tls_model("initial-exec")));
_Thread_local uint64_t gca__t_tc_id __attribute__((tls_model("initial-exec")));

static _Atomic uint64_t g_next_id = 1;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static bool g_key_ok;
/* Orders a thread's exit against the teardown of a device its caches name. */
static pthread_mutex_t g_tc_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the lock (Note [Thread cache lock]) ---- */

#define GCA__TC_SPINS  128
#define GCA__TC_NAP_NS 50000

void gca__tc_lock_slow(gca__tcache_t *tc) {
  for (unsigned i = 0;; i++) {
    unsigned c = atomic_load_explicit(&tc->lock, memory_order_relaxed);
    if (c == 0 && atomic_compare_exchange_weak_explicit(&tc->lock, &c, 1, memory_order_acquire,
                                                        memory_order_relaxed))
      return;
    if (i < GCA__TC_SPINS) {
      gca__cpu_relax();
      continue;
    }
    /* counted before the last look, so a waking unlock after it sees us */
    atomic_fetch_add_explicit(&tc->sleepers, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&tc->lock, memory_order_seq_cst) != 0) {
      struct timespec nap = {0, GCA__TC_NAP_NS};
      syscall(SYS_futex, &tc->lock, FUTEX_WAIT_PRIVATE, 1, &nap, NULL, 0);
    }
    atomic_fetch_sub_explicit(&tc->sleepers, 1, memory_order_relaxed);
  }
}

/* ---- sections (Note [Thread cache sections]) ---- */

uint32_t gca__tc_calm_limit = UINT32_MAX;

void gca__tc_fence_all(void) {
  gca__membarrier();
}

bool gca__tc_blocks(gca__tcache_t *tc) {
  if (atomic_load_explicit(&tc->quiet, memory_order_relaxed) != GCA__TC_QUIET ||
      tc->owner == gca__t_tc_id)
    return false; /* the owner itself runs none of its sections now */
  atomic_store_explicit(&tc->quiet, GCA__TC_BLOCKED, memory_order_relaxed);
  return true;
}

void gca__tc_wait_out(gca__tcache_t *tc) {
  gca__wait_inactive(&tc->active);
  /* back to the lock until the owner has been calm again for a while (the
   * owner's loads after the fence see GCA__TC_BLOCKED or this) */
  atomic_store_explicit(&tc->quiet, GCA__TC_LOUD, memory_order_relaxed);
  tc->calm = 0;
}

void gca__tc_block(gca__tcache_t *tc) {
  if (gca__tc_blocks(tc)) {
    gca__tc_fence_all();
    gca__tc_wait_out(tc);
    if (tc->d != NULL)
      tc->d->stats.num_cache_fences++; /* the visitor holds its device's lock */
  }
}

void gca__tc_unlock_wake(gca__tcache_t *tc) {
  atomic_store_explicit(&tc->lock, 0, memory_order_seq_cst);
  if (GCA_UNLIKELY(atomic_load_explicit(&tc->sleepers, memory_order_seq_cst) != 0))
    syscall(SYS_futex, &tc->lock, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- the domain table (tc's lock held, or the caller its owner under d->lock) ---- */

static void dom_insert(gca__tcache_t *tc, gca__block_t *b, bool apart) {
  uint32_t i = gca__tc_slot(b->addr);
  while (tc->keys[i] != 0)
    i = (i + 1) & (GCA__TC_SLOTS - 1);
  tc->keys[i] = b->addr;
  tc->vals[i] = b;
  tc->req[i] = 0;
  b->tc_slot = (uint8_t)i;
  b->tc_bin = (uint8_t)gca__tc_bin_index(b->stream, b->size);
  b->tc_ti = b->pool == &tc->d->small ? 0 : 1;
  tc->ndomain++;
  tc->d->tc_held++;
  atomic_fetch_or_explicit(&tc->filter, UINT64_C(1) << (gca__tc_slot(b->addr) >> 1),
                           memory_order_relaxed);
  b->tc = tc;
  b->tc_apart = apart;
  gca__pf_forget(tc->d, b->addr); /* Note [Free facts]: a domain's blocks have none */
}

/* Removes b, shifting back the entries that probed past its slot; a
 * handed-out block takes its requested size back. */
static void dom_remove(gca__tcache_t *tc, gca__block_t *b) {
  const uint32_t mask = GCA__TC_SLOTS - 1;
  int found = gca__tc_find(tc, b->addr);
  GCA_ASSERT(found >= 0);
  uint32_t i = (uint32_t)found;
  b->requested = tc->req[i];
  tc->keys[i] = 0;
  for (uint32_t j = (i + 1) & mask; tc->keys[j] != 0; j = (j + 1) & mask) {
    uint32_t home = gca__tc_slot(tc->keys[j]);
    /* the entry at j stays unless its home lies cyclically in (i, j] */
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!stays) {
      tc->keys[i] = tc->keys[j];
      tc->vals[i] = tc->vals[j];
      tc->req[i] = tc->req[j];
      tc->vals[i]->tc_slot = (uint8_t)i;
      tc->keys[j] = 0;
      i = j;
    }
  }
  tc->d->tc_held--;
  if (--tc->ndomain == 0)
    atomic_store_explicit(&tc->filter, 0, memory_order_relaxed);
  b->tc = NULL; /* b->tc_apart stays for to_tree */
}

/* Takes b out of tc's domain (tc's lock held); true when it was cached. */
static bool drop_locked(gca__tcache_t *tc, gca__block_t *b) {
  gca__tcbin_t *bin = gca__tc_bin(tc, b->stream, b->size);
  bool cached = false;
  for (uint32_t i = 0; i < bin->n && !cached; i++) {
    if (bin->blk[i] == b) {
      cached = true;
      memmove(&bin->blk[i], &bin->blk[i + 1], (bin->n - i - 1) * sizeof(bin->blk[0]));
      bin->n--;
      gca__tc_ncached_add(tc, -1);
      tc->cached_bytes -= b->size;
    }
  }
  dom_remove(tc, b);
  return cached;
}

bool gca__tc_cached(const gca__block_t *b) {
  return gca__tc_in_bin(gca__tc_bin(b->tc, b->stream, b->size), b);
}

size_t gca__tc_requested(const gca__block_t *b) {
  int i = gca__tc_find(b->tc, b->addr);
  return i >= 0 ? b->tc->req[i] : 0;
}

/* A cached block just out of its domain goes back to the free tree: out of
 * the pointer map, merged with its free neighbours, as the statistics count
 * it already or, when it counted as a run of its own (tc_apart), as a free
 * completing now would (Note [Thread cache runs]). */
static void to_tree(gca__devalloc_t *d, gca__block_t *b) {
  bool apart = b->tc_apart;
  int64_t blocks, bytes;
  d->epoch++; /* Note [Free cache epochs] */
  if (apart && d->fc_count != 0)
    gca__fcache_evict_near(d, b); /* the free cache's runs grow by b: they go first */
  b->allocated = false;
  gca__block_t *taken = gca__ptrmap_take(&d->ptrs, b->addr);
  GCA_ASSERT(taken == b);
  gca__block_coalesce(d, b, &blocks, &bytes);
  if (!apart) {
    GCA_ASSERT(blocks == b->fc_blocks && bytes == b->fc_bytes); /* its run did not change */
    return;
  }
  /* no more than it counted alone: no peak can move */
  int t = gca__stat_type(b->pool);
  gca__stat_add_t(d, d->stats.inactive_split, t, blocks - b->fc_blocks);
  gca__stat_add_t(d, d->stats.inactive_split_bytes, t, bytes - b->fc_bytes);
}

/* ---- the caches' lives ---- */

static void tthread_exit(void *arg);

static void key_once(void) {
  g_key_ok = pthread_key_create(&g_key, tthread_exit) == 0;
  /* Note [Thread cache sections]: without the registration, every fast path takes its lock */
  if (GCA__TC_SECTIONS_BUILD && gca__membarrier_ok())
    gca__tc_calm_limit = GCA__TC_CALM;
}

/* Brings d->tc_count up to date (d->lock held): on while the caches are on
 * and one exists. The bins' owed statistics are settled before it turns on
 * (Note [Owed bin statistics]: owed only while no cache counts). */
static void tc_count_sync(gca__devalloc_t *d) {
  bool on = d->tc_on && d->tcs != NULL;
  if (on && !d->tc_count)
    gca__fc_settled(d);
  d->tc_count = on;
}

/* Gives tc back to d (d->lock held): folded, its headroom returned, its
 * cached blocks to the tree, its handed-out ones let go, unlinked, dead. */
static void retire_locked(gca__devalloc_t *d, gca__tcache_t *tc) {
  gca__tc_lock(tc);
  gca__tc_fold_one(d, tc, ~0u);
  gca__tc_unlock_wake(tc);
  while (tc->ndomain != 0) {
    size_t i = 0;
    while (tc->keys[i] == 0)
      i++;
    gca__block_t *b = tc->vals[i];
    gca__tc_lock(tc);
    bool cached = drop_locked(tc, b);
    gca__tc_unlock_wake(tc);
    if (cached)
      to_tree(d, b);
  }
  if (tc->prev != NULL)
    tc->prev->next = tc->next;
  else
    d->tcs = tc->next;
  if (tc->next != NULL)
    tc->next->prev = tc->prev;
  d->ntcs--;
  tc_count_sync(d);
  gca__tc_lock(tc);
  tc->d = NULL;
  gca__tc_unlock_wake(tc);
}

static void tthread_exit(void *arg) {
  gca__tthread_t *t = arg;
  pthread_mutex_lock(&g_tc_mu);
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__tcache_t *tc = t->dev[i];
    if (tc == NULL)
      continue;
    gca__tc_lock(tc);
    gca__devalloc_t *d = tc->d;
    gca__tc_unlock_wake(tc);
    if (d != NULL) {
      gca__dev_lock(d);
      retire_locked(d, tc);
      gca__dev_unlock(d);
    }
    free(tc);
  }
  for (int i = 0; i < GCA__MAX_DEVICES; i++)
    free(t->parked[i]);
  pthread_mutex_unlock(&g_tc_mu);
  if (gca__t_tc == t)
    gca__t_tc = NULL;
  free(t);
}

/* The calling thread's cache of d, created on first use; NULL when the host
 * has no memory for it (the free goes on without it). */
static gca__tcache_t *tc_get(gca__devalloc_t *d) {
  gca__tthread_t *t = gca__t_tc;
  if (t == NULL) {
    pthread_once(&g_key_once, key_once);
    if (!g_key_ok || GCA_FAILPOINT("thread_cache"))
      return NULL;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
      return NULL;
    if (pthread_setspecific(g_key, t) != 0) {
      free(t);
      return NULL;
    }
    gca__t_tc = t;
  }
  gca__tcache_t *tc = t->dev[d->device];
  if (tc != NULL && tc->d == d)
    return tc;
  if (tc != NULL) { /* its device was torn down */
    free(tc);
    t->dev[d->device] = NULL;
  }
  /* a parked cache's thread tries again; parked on an allocator gone since,
   * it starts afresh */
  bool probe = t->parked[d->device] != NULL && t->inst[d->device] == d->inst;
  if (t->parked[d->device] != NULL) {
    tc = t->parked[d->device];
    t->parked[d->device] = NULL;
    t->probe[d->device] = 0;
    if (!probe)
      t->backoff[d->device] = 0;
  } else if ((tc = aligned_alloc(64, (sizeof(*tc) + 63) & ~(size_t)63)) == NULL) {
    return NULL;
  }
  memset(tc, 0, sizeof(*tc));
  if (probe) {
    tc->waste = GCA__TC_WASTE_OFF - 1; /* parked again if its first block goes unused */
    tc->probing = true;
  }
  atomic_init(&tc->lock, 0);
  atomic_init(&tc->sleepers, 0);
  atomic_init(&tc->ncached, 0);
  atomic_init(&tc->filter, 0);
  atomic_init(&tc->quiet, 0);
  atomic_init(&tc->active, 0);
  if (gca__t_tc_id == 0)
    gca__t_tc_id = atomic_fetch_add(&g_next_id, 1);
  tc->owner = gca__t_tc_id;
  tc->d = d;
  tc->next = d->tcs;
  if (d->tcs != NULL)
    d->tcs->prev = tc;
  d->tcs = tc;
  d->ntcs++;
  t->dev[d->device] = tc;
  tc_count_sync(d);
  gca__tc_gate_sync(d, gca__fc_quiet(d)); /* kept only while thread caches exist */
  return tc;
}

void gca__tc_destroy_all(gca__devalloc_t *d) {
  pthread_mutex_lock(&g_tc_mu);
  for (gca__tcache_t *tc = d->tcs, *next; tc != NULL; tc = next) {
    next = tc->next;
    gca__tc_lock(tc);
    tc->d = NULL;
    gca__tc_unlock_wake(tc);
  }
  d->tcs = NULL;
  d->ntcs = 0;
  d->tc_held = 0;
  tc_count_sync(d);
  pthread_mutex_unlock(&g_tc_mu);
}

/* ---- engagement and settings ---- */

void gca__tc_note_thread_slow(gca__devalloc_t *d) {
  if (gca__t_tc_id == 0)
    gca__t_tc_id = atomic_fetch_add(&g_next_id, 1);
  if (d->tc_thread == 0) {
    d->tc_thread = gca__t_tc_id;
    return;
  }
  if (d->tc_thread == gca__t_tc_id)
    return;
  d->tc_engaged = true;
  gca__tc_update(d, false);
}

void gca__tc_update(gca__devalloc_t *d, bool reset) {
  gca__fc_settled(d); /* Note [Owed bin statistics]: owed only while no cache counts */
  d->pf_epoch++;      /* Note [Free facts]: a thread cache may hand a block out unseen */
  d->tc_on = d->tc_engaged && d->cfg.thread_cache && d->fc_on && !d->has_divisions;
  if (reset || !d->tc_on) {
    /* every delta in and all headroom back: with the caches off and empty
     * nothing moves them, and the statistics need not count them (tc_count) */
    gca__tc_fold(d, ~0u);
    gca__tc_flush_all(d, true);
  }
  tc_count_sync(d);
  gca__tc_gate_sync(d, gca__fc_quiet(d));
}

/* ---- entering and the locked take ---- */

/* Whether tc wastes its entries and this free is not its probe (Note
 * [Thread cache waste]); the owner, under d->lock. */
/* Parks the calling thread's cache tc of d (d->lock held): given back as a
 * dying thread's is, kept for the thread's next cache. */
static void park(gca__devalloc_t *d, gca__tcache_t *tc) {
  gca__tthread_t *t = gca__t_tc;
  retire_locked(d, tc);
  d->stats.num_cache_parks++;
  t->dev[d->device] = NULL;
  free(t->parked[d->device]);
  t->parked[d->device] = tc;
  t->inst[d->device] = d->inst;
  /* a try that lost its first block and nothing else was no use: wait twice
   * as long for the next; a cache that served before it wasted starts over */
  uint8_t *bo = &t->backoff[d->device];
  *bo = tc->probing && tc->lost <= 1 ? (uint8_t)(*bo < GCA__TC_BACKOFF ? *bo + 1 : *bo) : 0;
  t->probe[d->device] = (uint32_t)GCA__TC_PROBE << *bo;
}

void gca__tc_park_mine(gca__devalloc_t *d) {
  park(d, gca__tc_mine(d->device));
}

/* A cached block of tc left unused (d->lock and tc's lock held); at
 * GCA__TC_WASTE_OFF the owner's next free parks tc. */
static void wasted(gca__tcache_t *tc) {
  if (tc->waste < GCA__TC_WASTE_OFF)
    tc->waste++;
  tc->lost++;
}

bool gca__tc_try_enter(gca__devalloc_t *d, gca__block_t *b) {
  if (!d->tc_on || b->nuses != 0 || b->pool->owner != NULL || b->seg->expandable ||
      b->size > GCA__TC_MAX_SIZE || b->oversize || (d->npending | d->ndeferred | d->ncaptures) != 0)
    return false;
  /* parked or full: refused before the neighbours' records are read (with a
   * million live blocks, misses each); a run of its own reads none (Note
   * [Thread cache runs]) */
  bool apart = d->cfg.recycle_bins;
  if (gca__tc_declines(d) || (!apart && gca__fc_near(b)))
    return false;
  gca__tcache_t *tc = tc_get(d); /* a full domain declined above */
  if (tc == NULL)
    return false;
  gca__tcbin_t *bin = gca__tc_bin(tc, b->stream, b->size);
  if (bin->n != 0 && (bin->stream != b->stream || bin->size != b->size)) {
    while (bin->n != 0) { /* another (stream, size) hashed here: the newer wins */
      gca__block_t *x = bin->blk[bin->n - 1];
      gca__tc_lock(tc);
      drop_locked(tc, x);
      wasted(tc);
      gca__tc_unlock_wake(tc);
      to_tree(d, x);
    }
  }
  if (bin->n == GCA__TC_BIN_MAX || tc->cached_bytes + b->size > GCA__TC_BYTES)
    return false;
  int64_t blocks, bytes;
  if (apart)
    gca__run_alone(b, &blocks, &bytes);
  else
    gca__fc_run_delta(b, &blocks, &bytes);
  b->fc_blocks = (int32_t)blocks; /* the run cannot change while b is in the domain */
  b->fc_bytes = bytes;
  b->fc_epoch = 0;
  d->epoch++; /* Note [Free cache epochs] */
  int t = gca__stat_type(b->pool);
  gca_devptr_t addr = b->addr;
  size_t requested = b->requested;
  gca__stat_block_free(d, b, t);
  gca__stat_add_t(d, d->stats.inactive_split, t, blocks);
  gca__stat_add_t(d, d->stats.inactive_split_bytes, t, bytes);
  gca__stat_dec_t(d, d->stats.requested_bytes, t, (int64_t)requested);
  b->requested = 0;
  gca__tc_lock(tc);
  dom_insert(tc, b, apart);
  bin->stream = b->stream;
  bin->size = b->size;
  bin->blk[bin->n++] = b;
  gca__tc_ncached_add(tc, 1);
  tc->cached_bytes += b->size;
  gca__tc_unlock_wake(tc);
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, addr, requested, b->stream);
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, addr, requested, b->stream);
  return true;
}

gca__block_t *gca__tc_take_locked(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                  size_t rounded, size_t size) {
  gca__tcache_t *tc = gca__tc_mine(d->device);
  if (tc == NULL || tc->d != d || atomic_load_explicit(&tc->ncached, memory_order_relaxed) == 0)
    return NULL;
  gca__tcbin_t *bin = gca__tc_bin(tc, stream, rounded);
  if (bin->n == 0 || bin->stream != stream || bin->size != rounded ||
      bin->blk[bin->n - 1]->pool != pool)
    return NULL;
  gca__block_t *b = bin->blk[bin->n - 1];
  /* the run's change in inactive_split undone: a fall counts in the cache's
   * room, as a fast take's does (Note [Thread cache runs]: the put that
   * follows needs it), a rise in the device's statistics */
  int64_t split = b->fc_blocks, split_bytes = b->fc_bytes;
  gca__tc_lock(tc);
  bin->n--;
  tc->req[gca__tc_find(tc, b->addr)] = size;
  gca__tc_ncached_add(tc, -1);
  tc->cached_bytes -= b->size;
  if (tc->waste < GCA__TC_WASTE_OFF) /* Note [Thread cache waste]: a hit its fast take missed */
    tc->waste++;
  int64_t *room = tc->room[b->tc_ti];
  room[GCA__TQ_SPLIT] += split > 0 ? split : 0;
  room[GCA__TQ_SPLIT_BYTES] += split_bytes > 0 ? split_bytes : 0;
  gca__tc_unlock_wake(tc);
  int t = gca__stat_type(pool);
  b->requested = size; /* for the statistics below; the cache's req is what counts */
  if (split < 0)
    gca__stat_add_t(d, d->stats.inactive_split, t, -split);
  if (split_bytes < 0)
    gca__stat_add_t(d, d->stats.inactive_split_bytes, t, -split_bytes);
  gca__stat_block_alloc(d, b, t, false);
  return b;
}

/* ---- leaving ---- */

bool gca__tc_claim(gca__devalloc_t *d, gca__block_t *b) {
  gca__tcache_t *tc = b->tc;
  (void)d;
  gca__tc_lock(tc);
  bool cached = gca__tc_cached(b);
  if (!cached)
    dom_remove(tc, b);
  gca__tc_unlock_wake(tc);
  return !cached;
}

bool gca__tc_live(gca__block_t *b) {
  gca__tcache_t *tc = b->tc;
  gca__tc_lock(tc);
  bool live = !gca__tc_cached(b);
  gca__tc_unlock_wake(tc);
  return live;
}

/* Takes b (->tc set) out of its domain; true when it was cached and went back
 * to the tree. */
static bool evict(gca__devalloc_t *d, gca__block_t *b) {
  gca__tcache_t *tc = b->tc;
  gca__tc_lock(tc);
  bool cached = drop_locked(tc, b);
  if (cached)
    wasted(tc);
  gca__tc_unlock_wake(tc);
  if (cached)
    to_tree(d, b);
  return cached;
}

void gca__tc_evict(gca__devalloc_t *d, gca__block_t *b) {
  evict(d, b);
}

bool gca__tc_clear_near(gca__devalloc_t *d, gca__block_t *b) {
  /* both are read first: an eviction below may merge b away */
  gca__block_t *p = b->prev, *n = b->next;
  bool merged = false;
  if (p != NULL && p->tc != NULL && !p->tc_apart) /* a run of its own stays as it is */
    merged |= evict(d, p);
  if (n != NULL && n->tc != NULL && !n->tc_apart)
    merged |= evict(d, n);
  return merged;
}

/* Takes one cached block of tc matching (pool, stream), or any when pool is
 * NULL, out of its domain (tc's lock held); NULL when none. */
static gca__block_t *pick_locked(gca__tcache_t *tc, const gca__pool_t *pool, gca_stream_t stream) {
  for (size_t i = 0; i < GCA__TC_BINS; i++) {
    gca__tcbin_t *bin = &tc->bins[i];
    gca__block_t *b = bin->n != 0 ? bin->blk[bin->n - 1] : NULL;
    if (b != NULL && (pool == NULL || (b->stream == stream && b->pool == pool))) {
      drop_locked(tc, b);
      return b;
    }
  }
  return NULL;
}

static size_t flush(gca__devalloc_t *d, const gca__pool_t *pool, gca_stream_t stream) {
  size_t n = 0;
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next) {
    for (;;) {
      gca__tc_lock(tc);
      gca__block_t *b = atomic_load_explicit(&tc->ncached, memory_order_relaxed) != 0
                            ? pick_locked(tc, pool, stream)
                            : NULL;
      gca__tc_unlock_wake(tc);
      if (b == NULL)
        break;
      to_tree(d, b);
      n++;
    }
  }
  return n;
}

size_t gca__tc_flush_stream(gca__devalloc_t *d, const gca__pool_t *pool, gca_stream_t stream) {
  return flush(d, pool, stream);
}

void gca__tc_flush_all(gca__devalloc_t *d, bool detach) {
  flush(d, NULL, NULL);
  if (!detach)
    return;
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next) {
    gca__tc_lock(tc);
    for (size_t i = 0; i < GCA__TC_SLOTS; i++) {
      if (tc->keys[i] != 0) {
        tc->vals[i]->requested = tc->req[i];
        tc->vals[i]->tc = NULL;
        tc->keys[i] = 0;
      }
    }
    d->tc_held -= tc->ndomain;
    tc->ndomain = 0;
    atomic_store_explicit(&tc->filter, 0, memory_order_relaxed);
    gca__tc_unlock_wake(tc);
  }
}
