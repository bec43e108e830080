/* ptrmap.c - the process-wide map from a live block's address to its block,
 * which is how gca_free finds the owning device and block.
 *
 * The map is split into shards chosen by a hash of the address, each an
 * open-addressing table (linear probing, backward-shift deletion, so no
 * tombstones) behind its own tiny spinlock. Threads freeing different pointers
 * almost never meet on a shard, so the map does not serialize them; entries
 * only change while the owning device's lock is held, which makes the map
 * and the device's blocks agree whenever that lock is free.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"

#define SHARD_BITS 6
#define NSHARDS (1u << SHARD_BITS)
#define INITIAL_CAP 64u

typedef struct shard {
  atomic_int lock;
  uint32_t count;
  uint32_t cap; /* power of two; count <= cap / 2 */
  gca_devptr_t *keys; /* 0 = empty slot */
  gca__block_t **vals;
  char pad[64 - 4 - 4 - 4 - 2 * sizeof(void *)];
} shard_t;

static shard_t shards[NSHARDS] __attribute__((aligned(64)));

static inline uint64_t hash_addr(gca_devptr_t a) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}

static inline shard_t *shard_of(uint64_t h) {
  return &shards[h >> (64 - SHARD_BITS)];
}

static inline void shard_lock(shard_t *s) {
  for (;;) {
    if (!atomic_exchange_explicit(&s->lock, 1, memory_order_acquire))
      return;
    while (atomic_load_explicit(&s->lock, memory_order_relaxed))
      sched_yield();
  }
}

static inline void shard_unlock(shard_t *s) {
  atomic_store_explicit(&s->lock, 0, memory_order_release);
}

/* Slot holding addr, or the empty slot where it would go. */
static inline uint32_t probe(const shard_t *s, uint64_t h, gca_devptr_t addr) {
  uint32_t mask = s->cap - 1, i = (uint32_t)h & mask;
  while (s->keys[i] != 0 && s->keys[i] != addr)
    i = (i + 1) & mask;
  return i;
}

static gca_status_t grow(shard_t *s) {
  uint32_t ncap = s->cap ? s->cap * 2 : INITIAL_CAP;
  gca_devptr_t *nk = calloc(ncap, sizeof(*nk));
  gca__block_t **nv = calloc(ncap, sizeof(*nv));
  if (nk == NULL || nv == NULL) {
    free(nk);
    free(nv);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: host out of memory growing the pointer map to %u entries", ncap);
  }
  shard_t old = *s;
  s->keys = nk;
  s->vals = nv;
  s->cap = ncap;
  for (uint32_t i = 0; i < old.cap; i++) {
    if (old.keys[i] == 0)
      continue;
    uint32_t j = probe(s, hash_addr(old.keys[i]), old.keys[i]);
    s->keys[j] = old.keys[i];
    s->vals[j] = old.vals[i];
  }
  free(old.keys);
  free(old.vals);
  return GCA_OK;
}

gca_status_t gca__ptrmap_insert(gca_devptr_t addr, gca__block_t *b) {
  uint64_t h = hash_addr(addr);
  shard_t *s = shard_of(h);
  gca_status_t st = GCA_OK;
  shard_lock(s);
  if ((s->count + 1) * 2 > s->cap)
    st = grow(s);
  if (st == GCA_OK) {
    uint32_t i = probe(s, h, addr);
    GCA_ASSERT(s->keys[i] == 0);
    s->keys[i] = addr;
    s->vals[i] = b;
    s->count++;
  }
  shard_unlock(s);
  return st;
}

gca__block_t *gca__ptrmap_find(gca_devptr_t addr) {
  uint64_t h = hash_addr(addr);
  shard_t *s = shard_of(h);
  gca__block_t *b = NULL;
  shard_lock(s);
  if (s->cap != 0) {
    uint32_t i = probe(s, h, addr);
    if (s->keys[i] == addr)
      b = s->vals[i];
  }
  shard_unlock(s);
  return b;
}

int gca__ptrmap_device(gca_devptr_t addr, size_t *size) {
  uint64_t h = hash_addr(addr);
  shard_t *s = shard_of(h);
  int dev = -1;
  shard_lock(s);
  if (s->cap != 0) {
    uint32_t i = probe(s, h, addr);
    if (s->keys[i] == addr) {
      dev = s->vals[i]->pool->dev->device;
      if (size != NULL)
        *size = s->vals[i]->size;
    }
  }
  shard_unlock(s);
  return dev;
}

static void remove_slot(shard_t *s, uint32_t i) {
  uint32_t mask = s->cap - 1;
  uint32_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (s->keys[j] == 0)
      break;
    uint32_t home = (uint32_t)hash_addr(s->keys[j]) & mask;
    /* move j back into the hole at i unless its home lies cyclically in (i, j] */
    bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      s->keys[i] = s->keys[j];
      s->vals[i] = s->vals[j];
      i = j;
    }
  }
  s->keys[i] = 0;
  s->vals[i] = NULL;
  s->count--;
}

gca__block_t *gca__ptrmap_take(gca_devptr_t addr, const gca__devalloc_t *d) {
  uint64_t h = hash_addr(addr);
  shard_t *s = shard_of(h);
  gca__block_t *b = NULL;
  shard_lock(s);
  if (s->cap != 0) {
    uint32_t i = probe(s, h, addr);
    if (s->keys[i] == addr && s->vals[i]->pool->dev == d) {
      b = s->vals[i];
      remove_slot(s, i);
    }
  }
  shard_unlock(s);
  return b;
}

size_t gca__ptrmap_count_device(const gca__devalloc_t *d) {
  size_t n = 0;
  for (uint32_t k = 0; k < NSHARDS; k++) {
    shard_t *s = &shards[k];
    shard_lock(s);
    for (uint32_t i = 0; i < s->cap; i++)
      if (s->keys[i] != 0 && s->vals[i]->pool->dev == d)
        n++;
    shard_unlock(s);
  }
  return n;
}

void gca__ptrmap_drop_device(const gca__devalloc_t *d) {
  for (uint32_t k = 0; k < NSHARDS; k++) {
    shard_t *s = &shards[k];
    shard_lock(s);
    for (uint32_t i = 0; i < s->cap;) {
      if (s->keys[i] != 0 && s->vals[i]->pool->dev == d)
        remove_slot(s, i); /* a later entry may have moved into i: look again */
      else
        i++;
    }
    shard_unlock(s);
  }
}
