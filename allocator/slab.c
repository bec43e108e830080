/* SPDX-License-Identifier: Apache-2.0 */
/* slab.c - the block records of a device: carved from slabs of SLAB_BLOCKS,
 * kept on a free list, never returned to the host until the allocator goes.
 *
 * The one idea: a step that may fail for want of host memory reserves its
 * record first (gca__block_reserve), so that the steps after it, which change
 * the allocator's structures, take records (gca__block_take) and cannot fail
 * half-way.
 */
#include <stdlib.h>

#include "alloc_core.h"

#define SLAB_BLOCKS 256

gca_status_t gca__block_reserve_slow(gca__devalloc_t *d) {
  if (d->nslabs == d->cap_slabs) {
    size_t ncap = d->cap_slabs ? d->cap_slabs * 2 : 16;
    void **n = realloc(d->slabs, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for block records");
    d->slabs = n;
    d->cap_slabs = ncap;
  }
  gca__block_t *slab = calloc(SLAB_BLOCKS, sizeof(*slab));
  if (slab == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for block records");
  d->slabs[d->nslabs++] = slab;
  for (size_t i = 0; i < SLAB_BLOCKS; i++) {
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
  if (GCA_UNLIKELY(b->uses != NULL)) {
    free(b->uses);
    b->uses = NULL;
  }
  b->next = d->block_free;
  d->block_free = b;
  d->live_blocks--;
}

void gca__slabs_destroy(gca__devalloc_t *d) {
  for (size_t i = 0; i < d->nslabs; i++)
    free(d->slabs[i]);
  free(d->slabs);
  d->slabs = NULL;
  d->nslabs = d->cap_slabs = 0;
  d->block_free = NULL;
}
