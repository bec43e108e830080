/* SPDX-License-Identifier: Apache-2.0 */
/* host_register.c - gca_host_register / gca_host_unregister (gca/host.h):
 * page-locking memory the caller owns, as cudaHostRegister, through the
 * device layer; no jemalloc involved, so built in every configuration. */
#include "common.h"
#include "device.h"
#include "gca/host.h"

GCA_API gca_status_t gca_host_register(void *ptr, size_t size) {
  static const char fn[] = "gca_host_register";
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return gca__error_prefix(st, "%s", fn);
  st = ops->host_register(ptr, size);
  return st == GCA_OK ? GCA_OK : gca__error_prefix(st, "%s", fn);
}

GCA_API gca_status_t gca_host_unregister(void *ptr) {
  static const char fn[] = "gca_host_unregister";
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return gca__error_prefix(st, "%s", fn);
  st = ops->host_unregister(ptr);
  return st == GCA_OK ? GCA_OK : gca__error_prefix(st, "%s", fn);
}
