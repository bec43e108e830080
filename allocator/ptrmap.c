/* SPDX-License-Identifier: Apache-2.0 */
/* ptrmap.c - how a pointer finds its block: a per-device pointer -> block
 * hash, and a process-wide, lock-free map from 2 MiB address granules to the
 * device whose segments cover them.
 *
 * The one idea: the pointer map lives inside the device allocator and is
 * guarded by the device's own lock, so the cached alloc/free pair pays for
 * that one lock and nothing else. Finding the device of a pointer (only
 * needed once a process uses more than one device) reads the granule map with
 * two plain atomic loads: no lock at all, so frees on different devices never
 * meet. Granule entries change only when segments come and go.
 *
 * The pointer map is open addressing with linear probing and backward-shift
 * deletion (no tombstones), kept at most half full.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"

#define INITIAL_CAP 64u

static gca_status_t grow(gca__ptrmap_t *m) {
  uint32_t ncap = m->cap ? m->cap * 2 : INITIAL_CAP;
  /* on huge pages once it is large (Note [Records on huge pages], slab.c) */
  gca__ptrslot_t *ns =
      GCA_FAILPOINT("ptrmap_grow") ? NULL : gca__table_alloc((size_t)ncap * sizeof(*ns));
  if (ns == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: host out of memory growing the pointer map to %u entries", ncap);
  gca__ptrmap_t old = *m;
  m->slots = ns;
  m->cap = ncap;
  for (uint32_t i = 0; i < old.cap; i++)
    if (old.slots[i].key != 0)
      m->slots[gca__ptrmap_probe(m, old.slots[i].key)] = old.slots[i];
  gca__table_free(old.slots, (size_t)old.cap * sizeof(*old.slots));
  return GCA_OK;
}

gca_status_t gca__ptrmap_insert(gca__ptrmap_t *m, gca_devptr_t addr, gca__block_t *b) {
  if (GCA_UNLIKELY((m->count + 1) * 2 > m->cap))
    GCA_CHECK(grow(m));
  gca__ptrslot_t *e = &m->slots[gca__ptrmap_probe(m, addr)];
  GCA_ASSERT(e->key == 0);
  *e = (gca__ptrslot_t){.key = addr, .val = b}; /* no facts (Note [Free facts]) */
  m->count++;
  return GCA_OK;
}

gca__block_t *gca__ptrmap_take(gca__ptrmap_t *m, gca_devptr_t addr) {
  if (m->cap == 0 || addr == 0)
    return NULL;
  uint32_t mask = m->cap - 1, i = gca__ptrmap_probe(m, addr);
  if (m->slots[i].key != addr)
    return NULL;
  gca__block_t *b = m->slots[i].val;
  for (uint32_t j = i;;) {
    j = (j + 1) & mask;
    if (m->slots[j].key == 0)
      break;
    uint32_t home = (uint32_t)gca__ptrmap_hash(m->slots[j].key) & mask;
    /* move j back into the hole at i unless its home lies cyclically in (i, j] */
    bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      m->slots[i] = m->slots[j];
      i = j;
    }
  }
  m->slots[i] = (gca__ptrslot_t){0};
  m->count--;
  return b;
}

void gca__ptrmap_destroy(gca__ptrmap_t *m) {
  gca__table_free(m->slots, (size_t)m->cap * sizeof(*m->slots));
  memset(m, 0, sizeof(*m));
}

/* ---- the granule -> device map ----
 * Entry of a granule: 0 when no segment covers it, else (device + 1) << 24 |
 * number of segments touching it. Segments of two devices never share a
 * granule on either backend; if they ever did, the entry says AMBIGUOUS and
 * lookups fall back to asking every device. */

#define GRANULE_SHIFT 21
#define LEAF_BITS     14
#define TOP_BITS      14 /* covers 2^(21 + 14 + 14) = 512 TiB of address space */
#define AMBIGUOUS     0xff000000u
#define COUNT_MASK    0x00ffffffu

static _Atomic(_Atomic uint32_t *) top[1u << TOP_BITS];
static atomic_bool beyond; /* a segment lies outside the covered range */

static _Atomic uint32_t *leaf_for(uint64_t g, bool create) {
  uint64_t t = g >> LEAF_BITS;
  if (t >= (1u << TOP_BITS))
    return NULL;
  _Atomic uint32_t *leaf = atomic_load_explicit(&top[t], memory_order_acquire);
  if (leaf != NULL || !create)
    return leaf;
  _Atomic uint32_t *fresh = calloc(1u << LEAF_BITS, sizeof(*fresh));
  if (fresh == NULL)
    return NULL;
  _Atomic uint32_t *expected = NULL;
  if (!atomic_compare_exchange_strong_explicit(&top[t], &expected, fresh, memory_order_acq_rel,
                                               memory_order_acquire)) {
    free(fresh);
    return expected;
  }
  return fresh;
}

static void entry_add(_Atomic uint32_t *e, int device, int delta) {
  uint32_t old = atomic_load_explicit(e, memory_order_relaxed), val;
  do {
    uint32_t owner = old & ~COUNT_MASK, count = old & COUNT_MASK;
    uint32_t me = (uint32_t)(device + 1) << 24;
    count = (uint32_t)((int)count + delta);
    if (count == 0)
      val = 0;
    else if (owner == 0 || owner == me)
      val = me | count;
    else
      val = AMBIGUOUS | count;
  } while (!atomic_compare_exchange_weak_explicit(e, &old, val, memory_order_release,
                                                  memory_order_relaxed));
}

gca_status_t gca__owner_add(gca_devptr_t base, size_t size, int device) {
  uint64_t g0 = base >> GRANULE_SHIFT, g1 = (base + size - 1) >> GRANULE_SHIFT;
  for (uint64_t g = g0; g <= g1; g++) {
    if ((g >> LEAF_BITS) >= (1u << TOP_BITS)) {
      atomic_store(&beyond, true);
      continue;
    }
    _Atomic uint32_t *leaf = leaf_for(g, true);
    if (leaf == NULL) {
      if (g > g0)
        gca__owner_remove(base, (size_t)((g << GRANULE_SHIFT) - base), device);
      return gca__error(GCA_ERR_OUT_OF_MEMORY,
                        "malloc: host out of memory for the address map of 0x%llx",
                        (unsigned long long)base);
    }
    entry_add(&leaf[g & ((1u << LEAF_BITS) - 1)], device, 1);
  }
  return GCA_OK;
}

void gca__owner_remove(gca_devptr_t base, size_t size, int device) {
  uint64_t g0 = base >> GRANULE_SHIFT, g1 = (base + size - 1) >> GRANULE_SHIFT;
  for (uint64_t g = g0; g <= g1; g++) {
    _Atomic uint32_t *leaf = leaf_for(g, false);
    if (leaf != NULL)
      entry_add(&leaf[g & ((1u << LEAF_BITS) - 1)], device, -1);
  }
}

int gca__owner_device(gca_devptr_t addr) {
  uint64_t g = addr >> GRANULE_SHIFT;
  if ((g >> LEAF_BITS) >= (1u << TOP_BITS))
    return atomic_load_explicit(&beyond, memory_order_relaxed) ? GCA__OWNER_ANY : -1;
  _Atomic uint32_t *leaf = leaf_for(g, false);
  if (leaf == NULL)
    return -1;
  uint32_t e = atomic_load_explicit(&leaf[g & ((1u << LEAF_BITS) - 1)], memory_order_acquire);
  if (e == 0)
    return -1;
  if ((e & ~COUNT_MASK) == AMBIGUOUS)
    return GCA__OWNER_ANY;
  return (int)(e >> 24) - 1;
}
