/* SPDX-License-Identifier: Apache-2.0 */
/* vmm.c - the driver side of virtual memory management for a device: the
 * allocation granularity, the list of devices that get access to new
 * mappings, and the create + map + set_access / unmap + release steps.
 *
 * The one idea: both kinds of segment built from mem_create handles (the
 * VMM-backed classic segments of ipc_handles, and expandable segments) go
 * through these few helpers, so the granularity is queried and checked once
 * per device by one rule, every mapping is opened to the same devices, and
 * every failure is undone the same way.
 */
#include <inttypes.h>

#include "alloc_core.h"

gca_status_t gca__vmm_granularity(gca__devalloc_t *d, size_t *out) {
  if (d->granularity == 0) {
    size_t g = 0;
    gca_status_t st = d->ops->mem_granularity(d->device, false, &g);
    if (st != GCA_OK)
      return gca__error_prefix(st, "malloc: granularity of device %d", d->device);
    if (g == 0 || (g & (g - 1)) != 0 || g % GCA__MIN_BLOCK_SIZE != 0)
      return gca__error(GCA_ERR_DRIVER,
                        "mem_granularity: device %d reports %zu bytes, expected a power of two "
                        "multiple of %zu",
                        d->device, g, GCA__MIN_BLOCK_SIZE);
    d->granularity = g;
  }
  *out = d->granularity;
  return GCA_OK;
}

int gca__vmm_access_list(const gca__devalloc_t *d, int *devs) {
  devs[0] = d->device;
  for (int i = 0; i < d->npeers; i++)
    devs[1 + i] = d->peers[i];
  return 1 + d->npeers;
}

gca_status_t gca__vmm_map_new(gca__devalloc_t *d, gca_devptr_t ptr, size_t len,
                              gca_memhandle_t *out) {
  gca_status_t st;
  gca_memhandle_t h = 0;
  int devs[GCA__MAX_DEVICES + 1];
  GCA_CHECK(d->ops->mem_create(d->device, len, &h));
  GCA_CHECK_GOTO(d->ops->mem_map(ptr, len, 0, h), st, fail_create);
  GCA_CHECK_GOTO(d->ops->mem_set_access(ptr, len, devs, gca__vmm_access_list(d, devs)), st,
                 fail_map);
  *out = h;
  return GCA_OK;

fail_map:
  GCA_CHECK_IGNORE(d->ops->mem_unmap(ptr, len));
fail_create:
  GCA_CHECK_IGNORE(d->ops->mem_release(h));
  return st;
}

gca_status_t gca__vmm_unmap(gca__devalloc_t *d, gca_devptr_t ptr, size_t len, gca_memhandle_t h,
                            bool *unmapped) {
  *unmapped = false;
  GCA_CHECK(d->ops->mem_unmap(ptr, len));
  *unmapped = true;
  return d->ops->mem_release(h);
}

void gca__vmm_destroy(gca__devalloc_t *d, gca_devptr_t base, size_t reserved,
                      const gca__mapping_t *maps, size_t nmaps) {
  for (size_t i = 0; i < nmaps; i++) {
    GCA_CHECK_IGNORE(d->ops->mem_unmap(base + maps[i].offset, maps[i].size));
    GCA_CHECK_IGNORE(d->ops->mem_release(maps[i].handle));
  }
  GCA_CHECK_IGNORE(d->ops->mem_address_free(d->device, base, reserved));
}
