/* SPDX-License-Identifier: Apache-2.0 */
/* ptrmap.h - the pointer map's lookups, inline for every free (ptrmap.c),
 * and the map of address granules to devices. Included by alloc_core.h.
 */
#ifndef GCA_PTRMAP_H
#define GCA_PTRMAP_H

/* Maps a live block's address to the block (the device's pointer map; the
 * caller holds the device lock). Insert fails only when the host is out of
 * memory (GCA_ERR_OUT_OF_MEMORY, detail set) and never right after a take. */
gca_status_t gca__ptrmap_insert(gca__ptrmap_t *m, gca_devptr_t addr, gca__block_t *b);
static inline uint64_t gca__ptrmap_hash(gca_devptr_t a) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}

/* Slot holding addr, or the empty slot where it would go (cap > 0). */
static inline uint32_t gca__ptrmap_probe(const gca__ptrmap_t *m, gca_devptr_t addr) {
  uint32_t mask = m->cap - 1, i = (uint32_t)gca__ptrmap_hash(addr) & mask;
  while (m->slots[i].key != 0 && m->slots[i].key != addr)
    i = (i + 1) & mask;
  return i;
}

/* The slot of addr, or NULL (inline: free looks every pointer up). */
static inline gca__ptrslot_t *gca__ptrmap_slot(const gca__ptrmap_t *m, gca_devptr_t addr) {
  gca__ptrslot_t *e = m->cap == 0 || addr == 0 ? NULL : &m->slots[gca__ptrmap_probe(m, addr)];
  return e != NULL && e->key == addr ? e : NULL;
}
static inline gca__block_t *gca__ptrmap_find(const gca__ptrmap_t *m, gca_devptr_t addr) {
  gca__ptrslot_t *e = gca__ptrmap_slot(m, addr);
  return e != NULL ? e->val : NULL;
}
/* Note [Free facts] (recycle.c): addr's block stops being a plain live block. */
static inline void gca__pf_forget(gca__devalloc_t *d, gca_devptr_t addr) {
  gca__ptrslot_t *e = gca__ptrmap_slot(&d->ptrs, addr);
  if (e != NULL)
    e->facts = 0;
}
/* Removes addr and returns its block, or NULL when absent. */
gca__block_t *gca__ptrmap_take(gca__ptrmap_t *m, gca_devptr_t addr);
void gca__ptrmap_destroy(gca__ptrmap_t *m);

/* Notes that device `device` has a segment at [base, base+size); GCA_ERR_OUT_OF_MEMORY
 * when the host cannot grow the map (nothing noted then). */
gca_status_t gca__owner_add(gca_devptr_t base, size_t size, int device);
void gca__owner_remove(gca_devptr_t base, size_t size, int device);
/* The device whose segment covers addr, -1 when none, GCA__OWNER_ANY when the
 * map cannot tell (ask every device). Lock-free. */
#define GCA__OWNER_ANY (-2)
int gca__owner_device(gca_devptr_t addr);

#endif
