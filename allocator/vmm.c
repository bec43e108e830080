/* SPDX-License-Identifier: Apache-2.0 */
/* vmm.c - the driver side of virtual memory management for a device: the
 * allocation granularity, the list of devices that get access to new
 * mappings, and the create + map + set_access / unmap + release steps.
 *
 * The one idea: both kinds of segment built from mem_create handles (the
 * VMM-backed classic segments of ipc_handles, and expandable segments) go
 * through these few helpers, so the granularity is queried and checked once
 * per device by one rule, every mapping is opened to the same devices, every
 * failure is undone the same way, and every driver call is counted in one
 * place (stats.num_driver_calls; atomically, as release batches call these
 * with the device lock let go).
 */
#include <inttypes.h>

#include "alloc_core.h"
#include "expandable.h"

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

gca_status_t gca__vmm_map_only(gca__devalloc_t *d, gca_devptr_t ptr, size_t len,
                               gca_memhandle_t h) {
  gca__count_calls(d, 1);
  return d->ops->mem_map(ptr, len, 0, h);
}

gca_status_t gca__vmm_set_access(gca__devalloc_t *d, gca_devptr_t ptr, size_t len) {
  int devs[GCA__MAX_DEVICES + 1];
  gca__count_calls(d, 1);
  GCA_CHECK(d->ops->mem_set_access(ptr, len, devs, gca__vmm_access_list(d, devs)));
  __atomic_fetch_add(&d->stats.grown_bytes, (int64_t)len, __ATOMIC_RELAXED);
  return GCA_OK;
}

gca_status_t gca__vmm_create_map(gca__devalloc_t *d, gca_devptr_t ptr, size_t len,
                                 gca_memhandle_t *out) {
  gca_status_t st;
  gca_memhandle_t h = 0;
  gca__count_calls(d, 1);
  GCA_CHECK(d->ops->mem_create(d->device, len, &h));
  GCA_CHECK_GOTO(gca__vmm_map_only(d, ptr, len, h), st, fail_create);
  *out = h;
  return GCA_OK;

fail_create:
  gca__vmm_release_handle(d, h);
  return st;
}

gca_status_t gca__vmm_map_new(gca__devalloc_t *d, gca_devptr_t ptr, size_t len,
                              gca_memhandle_t *out) {
  gca_status_t st;
  gca_memhandle_t h = 0;
  GCA_CHECK(gca__vmm_create_map(d, ptr, len, &h));
  GCA_CHECK_GOTO(gca__vmm_set_access(d, ptr, len), st, fail_map);
  *out = h;
  return GCA_OK;

fail_map:
  gca__count_calls(d, 2);
  GCA_CHECK_IGNORE(d->ops->mem_unmap(ptr, len));
  GCA_CHECK_IGNORE(d->ops->mem_release(h));
  return st;
}

gca_status_t gca__vmm_unmap_keep(gca__devalloc_t *d, gca_devptr_t ptr, size_t len) {
  gca__count_calls(d, 1);
  return d->ops->mem_unmap(ptr, len);
}

void gca__vmm_release_handle(gca__devalloc_t *d, gca_memhandle_t h) {
  gca__count_calls(d, 1);
  GCA_CHECK_IGNORE(d->ops->mem_release(h));
}

gca_status_t gca__vmm_unmap(gca__devalloc_t *d, gca_devptr_t ptr, size_t len, gca_memhandle_t h,
                            bool *unmapped) {
  *unmapped = false;
  GCA_CHECK(gca__vmm_unmap_keep(d, ptr, len));
  *unmapped = true;
  gca__count_calls(d, 1);
  return d->ops->mem_release(h);
}

void gca__vmm_destroy(gca__devalloc_t *d, gca_devptr_t base, size_t reserved,
                      const gca__mapping_t *maps, size_t nmaps) {
  gca__count_calls(d, (int64_t)(2 * nmaps + 1));
  for (size_t i = 0; i < nmaps; i++) {
    GCA_CHECK_IGNORE(d->ops->mem_unmap(base + maps[i].offset, maps[i].size));
    GCA_CHECK_IGNORE(d->ops->mem_release(maps[i].handle));
  }
  GCA_CHECK_IGNORE(d->ops->mem_address_free(d->device, base, reserved));
}
