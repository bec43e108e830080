/* SPDX-License-Identifier: Apache-2.0 */
/* host_blocks.c - the pinned host allocator's block records: one for each
 * block gca_host_alloc handed out that jemalloc has not had back since (live,
 * or cached in a thread's front cache), with its size and the streams it was
 * recorded on, and the table from a block's address to its record, so that a
 * free of anything else (device memory, malloc's, an interior pointer, a
 * block freed already) is refused with a clear error instead of corrupting
 * jemalloc's arena.
 *
 * Note [Host block records]: a record's state word is its lock. A
 * record_stream, or a free that finds the record through the table, claims a
 * live block with one compare-and-swap (LIVE -> BUSY, gca__host_rec_claim),
 * waiting out another claim; a free that finds it through its thread's hint
 * (Note [Host front cache], host.c) takes it with a load and a store
 * (gca__host_rec_take), since a locked instruction would add a fifth to the
 * whole alloc+free pair. Either works on the block alone and ends with a store: LIVE
 * again, CACHED (into the freeing thread's front cache, whose owner alone
 * turns it LIVE again with a store), or dropped (off the table, SPARE) before
 * jemalloc has the block back. So a free of a block freed already finds it
 * BUSY, CACHED or gone and is refused; what a take does not catch is a free
 * racing another free or a record_stream of the same block in another thread,
 * which is the caller's use after free (the table's lock used to catch it).
 * The snapshot reads records without claiming them. Records are allocated in
 * slabs and never freed, so a thread may keep pointers to records it handed
 * out without telling anyone: a stale one is recognised by its state or its
 * ptr, which a claim checks after the state (a record is given a new block
 * only while spare, before its LIVE store). The table (every record not
 * spare) is spread by address over 64 shards, each an open-addressing hash
 * (linear probing, backward-shift deletion, n * 2 <= cap) under its own spin
 * lock (Note [Host spin locks]); only jemalloc's side of a block's life (a
 * new block, a block given back) and claims without a hint touch it.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

#define SHARDS      64u
#define INLINE_USES 4u
#define SLAB_RECS   64u

/* Note [Host spin locks]: the table and the spare list take test-and-set spin
 * locks: one atomic exchange to take, a release store to give back (a
 * pthread mutex costs an atomic read-modify-write on both sides). A waiter
 * spins briefly, then yields. No lock is held across a call that waits. */
typedef struct spin {
  _Atomic int held;
} spin_t;

static inline void spin_lock(spin_t *l) {
  while (atomic_exchange_explicit(&l->held, 1, memory_order_acquire)) {
    for (unsigned i = 0; atomic_load_explicit(&l->held, memory_order_relaxed); i++) {
      if (i < 128) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();
      }
    }
  }
}

static inline void spin_unlock(spin_t *l) {
  atomic_store_explicit(&l->held, 0, memory_order_release);
}

typedef struct slot {
  uintptr_t ptr; /* 0: empty */
  gca__host_rec_t *rec;
} slot_t;

/* A cache line each: threads working on different shards do not share one. */
typedef struct shard {
  _Alignas(64) spin_t mu;
  slot_t *slots;
  size_t n, cap; /* cap 0 or a power of two; n * 2 <= cap */
} shard_t;

static shard_t shards[SHARDS];

/* The spare records; slabs are kept for good (Note [Host block records]). */
typedef struct slab {
  struct slab *next;
  gca__host_rec_t recs[SLAB_RECS];
} slab_t;

static struct {
  _Alignas(64) spin_t mu;
  gca__host_rec_t *spare;
  slab_t *slabs;
} pool;

static shard_t *shard_of(uintptr_t p) {
  return &shards[((p >> 4) * 0x9E3779B97F4A7C15ull) >> 58];
}

static size_t slot_of(const shard_t *s, uintptr_t p) {
  return (size_t)(((p >> 4) * 0xC2B2AE3D27D4EB4Full) >> 20) & (s->cap - 1);
}

static bool shard_grow(shard_t *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  slot_t *v = GCA_FAILPOINT("host_block_table") ? NULL : calloc(cap, sizeof(*v));
  if (!v)
    return false;
  slot_t *old = s->slots;
  size_t oldcap = s->cap;
  s->slots = v;
  s->cap = cap;
  for (size_t i = 0; i < oldcap; i++) {
    if (!old[i].ptr)
      continue;
    size_t j = slot_of(s, old[i].ptr);
    while (v[j].ptr)
      j = (j + 1) & (cap - 1);
    v[j] = old[i];
  }
  free(old);
  return true;
}

/* Under s->mu. */
static slot_t *shard_find(shard_t *s, uintptr_t p) {
  if (!s->cap)
    return NULL;
  for (size_t j = slot_of(s, p);; j = (j + 1) & (s->cap - 1)) {
    if (s->slots[j].ptr == p)
      return &s->slots[j];
    if (!s->slots[j].ptr)
      return NULL;
  }
}

/* Under s->mu. */
static void shard_remove(shard_t *s, slot_t *e) {
  size_t mask = s->cap - 1, i = (size_t)(e - s->slots);
  s->slots[i].ptr = 0;
  s->n--;
  for (size_t j = (i + 1) & mask; s->slots[j].ptr; j = (j + 1) & mask) {
    size_t home = slot_of(s, s->slots[j].ptr);
    if (((j - home) & mask) >= ((j - i) & mask)) {
      s->slots[i] = s->slots[j];
      s->slots[j].ptr = 0;
      i = j;
    }
  }
}

/* A spare record, off the spare list; NULL when no slab can be made. */
static gca__host_rec_t *rec_take(void) {
  spin_lock(&pool.mu);
  if (!pool.spare) {
    slab_t *sl = GCA_FAILPOINT("host_block_table") ? NULL : aligned_alloc(64, sizeof(*sl));
    if (!sl) {
      spin_unlock(&pool.mu);
      return NULL;
    }
    memset(sl, 0, sizeof(*sl));
    sl->next = pool.slabs;
    pool.slabs = sl;
    for (unsigned i = SLAB_RECS; i-- > 0;) {
      sl->recs[i].next = pool.spare;
      pool.spare = &sl->recs[i];
    }
  }
  gca__host_rec_t *r = pool.spare;
  pool.spare = r->next;
  spin_unlock(&pool.mu);
  return r;
}

static void rec_put(gca__host_rec_t *r) {
  spin_lock(&pool.mu);
  r->next = pool.spare;
  pool.spare = r;
  spin_unlock(&pool.mu);
}

gca__host_rec_t *gca__host_rec_add(void *ptr, size_t jsize, uint32_t bin, size_t size) {
  uintptr_t p = (uintptr_t)ptr;
  gca__host_rec_t *r = rec_take();
  if (!r)
    return NULL;
  r->bin = bin;
  r->jsize = jsize;
  atomic_store_explicit(&r->size, size, memory_order_relaxed);
  r->next = NULL;
  atomic_store_explicit(&r->ptr, p, memory_order_relaxed);
  atomic_store_explicit(&r->state, GCA__HREC_LIVE, memory_order_release);
  shard_t *s = shard_of(p);
  spin_lock(&s->mu);
  bool ok = (s->n + 1) * 2 <= s->cap || shard_grow(s);
  if (ok) {
    size_t j = slot_of(s, p);
    while (s->slots[j].ptr)
      j = (j + 1) & (s->cap - 1);
    s->slots[j] = (slot_t){.ptr = p, .rec = r};
    s->n++;
  }
  spin_unlock(&s->mu);
  if (ok)
    return r;
  atomic_store_explicit(&r->state, GCA__HREC_SPARE, memory_order_relaxed);
  atomic_store_explicit(&r->ptr, 0, memory_order_relaxed);
  rec_put(r);
  return NULL;
}

gca__host_rec_t *gca__host_rec_find(const void *ptr) {
  shard_t *s = shard_of((uintptr_t)ptr);
  spin_lock(&s->mu);
  slot_t *e = shard_find(s, (uintptr_t)ptr);
  gca__host_rec_t *r = e ? e->rec : NULL;
  spin_unlock(&s->mu);
  return r;
}

static gca_status_t not_live(const char *fn, const void *ptr) {
  return gca__error(GCA_ERR_INVALID_POINTER,
                    "%s: %p is not a live block of pinned host memory from gca_host_alloc (a "
                    "device pointer, another allocator's memory, or freed already)",
                    fn, ptr);
}

/* LIVE -> BUSY with a compare-and-swap: true when claimed for ptr; *busy
 * when another claim holds it. */
static bool claim_cas(gca__host_rec_t *r, const void *ptr, bool *busy) {
  uint32_t live = GCA__HREC_LIVE;
  if (!atomic_compare_exchange_strong_explicit(&r->state, &live, GCA__HREC_BUSY,
                                               memory_order_acquire, memory_order_relaxed)) {
    *busy = live == GCA__HREC_BUSY;
    return false;
  }
  *busy = false;
  if (atomic_load_explicit(&r->ptr, memory_order_relaxed) == (uintptr_t)ptr)
    return true;
  gca__host_rec_unclaim(r); /* a stale hint's record, another block's now */
  return false;
}

gca_status_t gca__host_rec_claim(const char *fn, void *ptr, gca__host_rec_t *hint,
                                 gca__host_rec_t **out) {
  for (unsigned i = 0; ptr; i++) {
    gca__host_rec_t *r = hint;
    if (!r || atomic_load_explicit(&r->ptr, memory_order_relaxed) != (uintptr_t)ptr)
      r = gca__host_rec_find(ptr);
    if (!r)
      break;
    bool busy;
    if (claim_cas(r, ptr, &busy)) {
      *out = r;
      return GCA_OK;
    }
    if (!busy)
      break;
    if (i < 128) { /* another claim holds it: a free deferring, or a record_stream */
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      sched_yield();
    }
  }
  return not_live(fn, ptr);
}

void gca__host_rec_drop(gca__host_rec_t *r) {
  uintptr_t p = atomic_load_explicit(&r->ptr, memory_order_relaxed);
  shard_t *s = shard_of(p);
  spin_lock(&s->mu);
  slot_t *e = shard_find(s, p);
  GCA_ASSERT(e != NULL && e->rec == r);
  shard_remove(s, e);
  spin_unlock(&s->mu);
  if (r->uses) { /* most blocks never recorded a stream: no call */
    free(r->uses);
    r->uses = NULL;
  }
  atomic_store_explicit(&r->nuses, 0, memory_order_relaxed);
  r->capuses = 0;
  atomic_store_explicit(&r->state, GCA__HREC_SPARE, memory_order_relaxed);
  atomic_store_explicit(&r->ptr, 0, memory_order_relaxed);
  rec_put(r);
}

gca_status_t gca__host_rec_add_use(const char *fn, gca__host_rec_t *r, gca_stream_t stream) {
  uint32_t n = atomic_load_explicit(&r->nuses, memory_order_relaxed);
  for (uint32_t i = 0; i < n; i++)
    if (r->uses[i] == stream)
      return GCA_OK;
  if (n == r->capuses) {
    uint32_t cap = r->capuses ? r->capuses * 2 : INLINE_USES;
    gca_stream_t *v =
        GCA_FAILPOINT("host_record_stream") ? NULL : realloc(r->uses, cap * sizeof(*v));
    if (!v)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to record a stream on %p", fn,
                        (void *)atomic_load_explicit(&r->ptr, memory_order_relaxed));
    r->uses = v;
    r->capuses = cap;
  }
  r->uses[n] = stream;
  atomic_store_explicit(&r->nuses, n + 1, memory_order_relaxed);
  return GCA_OK;
}

void gca__host_blocks_walk(gca__host_block_fn fn, void *ctx) {
  for (unsigned i = 0; i < SHARDS; i++) {
    shard_t *s = &shards[i];
    spin_lock(&s->mu); /* the records found stay theirs: a drop takes it */
    for (size_t j = 0; j < s->cap; j++) {
      gca__host_rec_t *r = s->slots[j].rec;
      if (!s->slots[j].ptr)
        continue;
      uint32_t st = atomic_load_explicit(&r->state, memory_order_acquire);
      if (st == GCA__HREC_LIVE || st == GCA__HREC_BUSY)
        fn(ctx, (const void *)s->slots[j].ptr, atomic_load_explicit(&r->size, memory_order_relaxed),
           atomic_load_explicit(&r->nuses, memory_order_relaxed));
    }
    spin_unlock(&s->mu);
  }
}
