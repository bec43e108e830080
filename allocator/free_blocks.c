/* SPDX-License-Identifier: Apache-2.0 */
/* free_blocks.c - gca_get_free_blocks(): a device's cached free memory, the
 * figure behind external fragmentation (1 - largest free block / free bytes).
 *
 * The one idea: it is a fold over the read-only walk (introspect.h) that
 * snapshots use, so it sees exactly the layout a snapshot would show
 * (inactive blocks, the free cache flushed back into the free structure).
 */
#include "alloc_core.h"
#include "introspect.h"

#include "gca/allocator.h"

typedef struct free_sum {
  uint64_t total, largest;
} free_sum_t;

static void add_segment(const gca_segment_info_t *seg, const gca_block_info_t *blocks,
                        size_t nblocks, void *ctx) {
  free_sum_t *f = ctx;
  GCA_UNUSED(seg);
  for (size_t i = 0; i < nblocks; i++) {
    if (blocks[i].state != GCA_BLOCK_INACTIVE)
      continue;
    f->total += blocks[i].size;
    if (blocks[i].size > f->largest)
      f->largest = blocks[i].size;
  }
}

GCA_API gca_status_t gca_get_free_blocks(int device, uint64_t *free_bytes, uint64_t *largest_free) {
  if (free_bytes == NULL || largest_free == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_free_blocks: NULL output");
  if (device < 0 || device >= GCA__MAX_DEVICES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_free_blocks: device %d is not in [0, %d)",
                      device, GCA__MAX_DEVICES);
  free_sum_t f = {0, 0};
  gca_status_t st = gca__allocator_walk(device, add_segment, &f);
  if (st != GCA_OK)
    return gca__error_prefix(st, "get_free_blocks: device %d", device);
  *free_bytes = f.total;
  *largest_free = f.largest;
  return GCA_OK;
}
