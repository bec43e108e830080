/* SPDX-License-Identifier: Apache-2.0 */
/* slab.c - the block records of a device: carved from slabs that double in
 * size, kept on a free list, never returned to the host until the allocator
 * goes.
 *
 * The one idea: a step that may fail for want of host memory reserves its
 * record first (gca__block_reserve), so that the steps after it, which change
 * the allocator's structures, take records (gca__block_take) and cannot fail
 * half-way.
 *
 * Note [Records on huge pages]: with a million live blocks and as many free,
 * a free reads a pointer-map slot, its block, the block's two neighbours,
 * and a free-tree descent reads a block per level, each anywhere in several
 * hundred megabytes of records. On 4 KiB pages nearly every one of those
 * reads also misses the TLB, and the page walk misses the cache in turn: that
 * doubled the cost of each read. So the tables that grow with the live set
 * come from gca__table_alloc: a table of 2 MiB or more is its own mapping,
 * aligned to 2 MiB and advised MADV_HUGEPAGE, so one TLB entry covers 2 MiB
 * of it where the kernel has huge pages (and a plain mapping where not: the
 * advice is a hint, its failure changes nothing). Slabs start at
 * SLAB_FIRST records, so a small process keeps a small footprint, and double
 * up to SLAB_MAX records (3 MiB), where each is such a table. Records are
 * aligned to a cache line, so that what a descent reads of one (its first
 * line, see struct gca__block) costs one miss.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "alloc_core.h"

#define SLAB_FIRST 256
#define SLAB_MAX   16384
#define HUGE_PAGE  ((size_t)2 << 20)

/* what a descent and a merge check read shares the record's first line */
_Static_assert(_Alignof(gca__block_t) == 64 && sizeof(gca__block_t) % 64 == 0,
               "block records are whole cache lines");
_Static_assert(offsetof(gca__block_t, prio) + sizeof(uint32_t) <= 64 &&
                   offsetof(gca__block_t, next) + sizeof(gca__block_t *) <= 64 &&
                   offsetof(gca__block_t, unmapped) < 64 && offsetof(gca__block_t, in_tree) < 64,
               "a descent's and a merge's fields lie in the first line (Note [Record lines])");
_Static_assert(offsetof(gca__block_t, stream) == 64 &&
                   offsetof(gca__block_t, gc_base) + sizeof(uint64_t) <= 128 &&
                   offsetof(gca__block_t, oversize) < 128 && offsetof(gca__block_t, tc) < 128,
               "a free's and an allocation's fields lie in the second line");

struct gca__slab {
  gca__block_t *records;
  size_t n;
};

void *gca__table_alloc(size_t bytes) {
  if (bytes < HUGE_PAGE) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
      return NULL;
    return memset(p, 0, bytes);
  }
  /* a mapping with room to start on a 2 MiB boundary; the slack is unmapped */
  size_t len = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  char *raw =
      mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return NULL;
  char *p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (p > raw)
    munmap(raw, (size_t)(p - raw));
  if (raw + HUGE_PAGE > p)
    munmap(p + len, (size_t)(raw + HUGE_PAGE - p));
#ifdef MADV_HUGEPAGE
  (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: without it, plain pages */
#endif
  return p; /* anonymous memory reads as zero */
}

void gca__table_free(void *p, size_t bytes) {
  if (p == NULL)
    return;
  if (bytes < HUGE_PAGE)
    free(p);
  else
    munmap(p, (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
}

gca_status_t gca__block_reserve_slow(gca__devalloc_t *d) {
  if (d->nslabs == d->cap_slabs) {
    size_t ncap = d->cap_slabs ? d->cap_slabs * 2 : 16;
    struct gca__slab *n =
        GCA_FAILPOINT("block_slab_index") ? NULL : realloc(d->slabs, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for block records");
    d->slabs = n;
    d->cap_slabs = ncap;
  }
  size_t count = d->nslabs == 0 ? SLAB_FIRST : d->slabs[d->nslabs - 1].n * 2;
  if (count > SLAB_MAX)
    count = SLAB_MAX;
  gca__block_t *slab = GCA_FAILPOINT("block_slab") ? NULL : gca__table_alloc(count * sizeof(*slab));
  if (slab == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: host out of memory for %zu more block records", count);
  d->slabs[d->nslabs++] = (struct gca__slab){slab, count};
  for (size_t i = count; i-- > 0;) { /* the list hands them out in address order */
    slab[i].next = d->block_free;
    d->block_free = &slab[i];
  }
  return GCA_OK;
}

gca_status_t gca__block_new(gca__devalloc_t *d, gca__block_t **out) {
  GCA_CHECK(gca__block_reserve(d));
  *out = gca__block_take(d);
  return GCA_OK;
}

void gca__block_free(gca__devalloc_t *d, gca__block_t *b) {
  if (GCA_UNLIKELY(b->uses != NULL))
    gca__block_drop_uses(d, b);
  gca__block_free_merged(d, b);
}

void gca__block_drop_uses(gca__devalloc_t *d, gca__block_t *b) {
  free(b->uses);
  b->uses = NULL;
  gca__uses_set(d, b, 0);
  b->cap_uses = 0;
}

void gca__slabs_destroy(gca__devalloc_t *d) {
  for (size_t i = 0; i < d->nslabs; i++)
    gca__table_free(d->slabs[i].records, d->slabs[i].n * sizeof(gca__block_t));
  free(d->slabs);
  d->slabs = NULL;
  d->nslabs = d->cap_slabs = 0;
  d->block_free = NULL;
}
