/* SPDX-License-Identifier: Apache-2.0 */
/* host_blocks.c - the pinned host allocator's table of live blocks: which
 * pointers gca_host_alloc handed out (with their size and the streams they
 * were recorded on), so that a free of anything else (device memory,
 * malloc's, an interior pointer, a block freed already) is refused with a
 * clear error instead of corrupting jemalloc's arena.
 *
 * The one idea: blocks are spread by address over 64 shards, each an
 * open-addressing hash (linear probing, backward-shift deletion, n * 2 <= cap)
 * under its own spin lock (Note [Host spin locks]), so threads freeing
 * unrelated blocks rarely meet and a table operation is one atomic exchange.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

#define SHARDS      64u
#define INLINE_USES 4u

/* Note [Host spin locks]: the table is on the hot path of every allocation
 * and free, so its shards take test-and-set spin locks: one atomic exchange
 * to take, a release store to give back (a pthread mutex costs an atomic
 * read-modify-write on both sides). A waiter spins briefly, then yields. A
 * shard's lock is held across the deferral of a free (event records), so a
 * waiter may yield for that long. */
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

/* A live block; uses: the distinct streams it was recorded on (nuses <= capuses). */
typedef struct block {
  uintptr_t ptr; /* 0: empty slot */
  size_t size;
  uint32_t nuses, capuses;
  gca_stream_t *uses; /* NULL until the first record_stream */
} block_t;

/* A cache line each: threads working on different shards do not share one. */
typedef struct shard {
  _Alignas(64) spin_t mu;
  block_t *slots;
  size_t n, cap; /* cap 0 or a power of two; n * 2 <= cap */
} shard_t;

static shard_t shards[SHARDS];

static shard_t *shard_of(uintptr_t p) {
  return &shards[((p >> 4) * 0x9E3779B97F4A7C15ull) >> 58];
}

static size_t slot_of(const shard_t *s, uintptr_t p) {
  return (size_t)(((p >> 4) * 0xC2B2AE3D27D4EB4Full) >> 20) & (s->cap - 1);
}

static bool shard_grow(shard_t *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  block_t *v = GCA_FAILPOINT("host_block_table") ? NULL : calloc(cap, sizeof(*v));
  if (!v)
    return false;
  block_t *old = s->slots;
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
static block_t *shard_find(shard_t *s, uintptr_t p) {
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
static void shard_remove(shard_t *s, block_t *b) {
  size_t mask = s->cap - 1, i = (size_t)(b - s->slots);
  if (b->uses) /* most blocks never recorded a stream: no call */
    free(b->uses);
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

static gca_status_t not_live(const char *fn, const void *ptr) {
  return gca__error(GCA_ERR_INVALID_POINTER,
                    "%s: %p is not a live block of pinned host memory from gca_host_alloc (a "
                    "device pointer, another allocator's memory, or freed already)",
                    fn, ptr);
}

bool gca__host_blocks_insert(void *ptr, size_t size) {
  uintptr_t p = (uintptr_t)ptr;
  shard_t *s = shard_of(p);
  spin_lock(&s->mu);
  bool ok = (s->n + 1) * 2 <= s->cap || shard_grow(s);
  if (ok) {
    size_t j = slot_of(s, p);
    while (s->slots[j].ptr)
      j = (j + 1) & (s->cap - 1);
    s->slots[j] = (block_t){.ptr = p, .size = size};
    s->n++;
  }
  spin_unlock(&s->mu);
  return ok;
}

gca_status_t gca__host_blocks_remove(const char *fn, void *ptr, gca__host_park_fn park, void *ctx,
                                     size_t *size, bool *parked) {
  shard_t *s = shard_of((uintptr_t)ptr);
  gca_status_t st = GCA_OK;
  spin_lock(&s->mu);
  block_t *b = shard_find(s, (uintptr_t)ptr);
  if (!b) {
    st = not_live(fn, ptr);
    goto out;
  }
  *size = b->size;
  *parked = b->nuses > 0;
  if (*parked && (st = park(ctx, ptr, b->size, b->uses, b->nuses)) != GCA_OK)
    goto out;
  shard_remove(s, b);
out:
  spin_unlock(&s->mu);
  return st;
}

gca_status_t gca__host_blocks_record(const char *fn, void *ptr, gca_stream_t stream) {
  shard_t *s = shard_of((uintptr_t)ptr);
  gca_status_t st = GCA_OK;
  spin_lock(&s->mu);
  block_t *b = ptr ? shard_find(s, (uintptr_t)ptr) : NULL;
  if (!b) {
    st = not_live(fn, ptr);
    goto out;
  }
  for (uint32_t i = 0; i < b->nuses; i++)
    if (b->uses[i] == stream)
      goto out;
  if (b->nuses == b->capuses) {
    uint32_t cap = b->capuses ? b->capuses * 2 : INLINE_USES;
    gca_stream_t *v =
        GCA_FAILPOINT("host_record_stream") ? NULL : realloc(b->uses, cap * sizeof(*v));
    if (!v) {
      st =
          gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to record a stream on %p", fn, ptr);
      goto out;
    }
    b->uses = v;
    b->capuses = cap;
  }
  b->uses[b->nuses++] = stream;
out:
  spin_unlock(&s->mu);
  return st;
}

void gca__host_blocks_walk(gca__host_block_fn fn, void *ctx) {
  for (unsigned i = 0; i < SHARDS; i++) {
    shard_t *s = &shards[i];
    spin_lock(&s->mu);
    for (size_t j = 0; j < s->cap; j++)
      if (s->slots[j].ptr)
        fn(ctx, (const void *)s->slots[j].ptr, s->slots[j].size, s->slots[j].nuses);
    spin_unlock(&s->mu);
  }
}
