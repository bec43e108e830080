/* SPDX-License-Identifier: Apache-2.0 */
/* sizes.c - the size rules: how a request is rounded, how large a segment is
 * made for it, when a free block may serve it and when serving it splits the
 * block, and whether more bytes may be reserved under the device's limit.
 *
 * The one idea: every size decision is pure arithmetic on the request, the
 * block and the settings (PyTorch's CUDACachingAllocator constants and rules,
 * so the same configuration yields the same sizes), kept here so that the
 * floors above share one copy of each rule.
 */
#include <stdio.h>

#include "alloc_core.h"

size_t gca__alloc_round_size(const gca_alloc_config_t *cfg, size_t size) {
  if (size < GCA__MIN_BLOCK_SIZE)
    return GCA__MIN_BLOCK_SIZE;
  uint32_t divisions = gca__config_roundup_divisions(cfg, size);
  if (divisions > 1 && size > GCA__MIN_BLOCK_SIZE * divisions) {
    if ((size & (size - 1)) == 0)
      return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll(size));
    size_t step = floor2 >> (31 - __builtin_clz(divisions));
    if (step == 0)
      return floor2 << 1;
    size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
  }
  return GCA__MIN_BLOCK_SIZE * ((size + GCA__MIN_BLOCK_SIZE - 1) / GCA__MIN_BLOCK_SIZE);
}

size_t gca__alloc_segment_size(size_t rounded) {
  if (rounded <= GCA__SMALL_SIZE)
    return GCA__SMALL_BUFFER;
  if (rounded < GCA__MIN_LARGE_ALLOC)
    return GCA__LARGE_BUFFER;
  return GCA__ROUND_LARGE * ((rounded + GCA__ROUND_LARGE - 1) / GCA__ROUND_LARGE);
}

bool gca__alloc_should_split(const gca_alloc_config_t *cfg, bool small_pool, size_t block_size,
                             size_t rounded) {
  size_t remaining = block_size - rounded;
  if (small_pool)
    return remaining >= GCA__MIN_BLOCK_SIZE;
  return rounded < cfg->max_split_size && remaining > GCA__SMALL_SIZE;
}

bool gca__alloc_block_fits(const gca_alloc_config_t *cfg, size_t block_size, size_t rounded) {
  if (rounded < cfg->max_split_size && block_size >= cfg->max_split_size)
    return false; /* an oversize block does not serve a splittable request */
  if (rounded >= cfg->max_split_size && block_size - rounded >= cfg->max_non_split_rounding)
    return false; /* nor a much smaller oversize request */
  return true;
}

size_t gca__alloc_no_split_segment_size(size_t rounded) {
  if (rounded <= GCA__SMALL_SIZE)
    return GCA__SMALL_BUFFER;
  return GCA__ROUND_LARGE * ((rounded + GCA__ROUND_LARGE - 1) / GCA__ROUND_LARGE);
}

gca_status_t gca__limit_check(const gca__devalloc_t *d, size_t bytes, const char *what) {
  if (!d->set_fraction || d->reserved + d->reserving + bytes <= d->allowed_max)
    return GCA_OK;
  return gca__error(GCA_ERR_OUT_OF_MEMORY,
                    "malloc: %s of %zu bytes would pass device %d's limit of %zu bytes "
                    "(%zu reserved%s)",
                    what, bytes, d->device, d->allowed_max, d->reserved + d->reserving,
                    d->reserving != 0 ? ", some being allocated by other threads" : "");
}
