/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_mem.c - memory on the cuda backend: classic allocations, virtual
 * memory management (reserve, create, map, access), sharing a handle by POSIX
 * fd or fabric handle, and pinned host memory.
 *
 * The one idea: each op is one driver call after its checks, in the context
 * the call needs (Note [Cuda contexts]); what the driver may refuse for this
 * process rather than for the device (fabric handles without an IMEX channel)
 * is learnt once and not asked again (Note [Fabric handles]).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#ifdef GCA_CUDA_FULL

static gca_status_t cuda_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
  GCA_CHECK(gca__cuda_enter_dev("mem_get_info", dev));
  CU_CHECK("mem_get_info", gca__cuda_drv.MemGetInfo(free_bytes, total_bytes));
  return GCA_OK;
}

/* ---- classic memory ---- */

static gca_status_t cuda_mem_alloc(int dev, size_t size, gca_devptr_t *out) {
  GCA_CHECK(gca__cuda_enter_dev("mem_alloc", dev));
  CUdeviceptr p = 0;
  CU_CHECK("mem_alloc", gca__cuda_drv.MemAlloc(&p, size));
  *out = (gca_devptr_t)p;
  return GCA_OK;
}

static gca_status_t cuda_mem_free(int dev, gca_devptr_t ptr) {
  GCA_CHECK(gca__cuda_enter_dev("mem_free", dev));
  CU_CHECK("mem_free", gca__cuda_drv.MemFree((CUdeviceptr)ptr));
  return GCA_OK;
}

/* ---- virtual memory management ---- */

/* Note [Fabric handles]: a device that reports HANDLE_TYPE_FABRIC_SUPPORTED
 * gets its memory created with POSIX_FD | FABRIC requested, so every handle can
 * later be exported either way. The attribute says what the hardware can do,
 * not whether this process may: without an IMEX channel cuMemCreate refuses
 * the fabric request with CUDA_ERROR_NOT_PERMITTED (an H200 with driver 580
 * reports the attribute as 1 and does so), or NOT_SUPPORTED. So whether
 * fabric handles can be made is settled once per device: by its first
 * mem_create, or by a probe (one granule created with FABRIC requested, then
 * released) when GCA_ATTR_FABRIC_SUPPORTED is asked first. After a refusal the
 * create is retried without FABRIC and the device stops asking: memory stays
 * fd-exportable, GCA_ATTR_FABRIC_SUPPORTED answers 0, and mem_export_fabric of
 * memory made without fabric handles is GCA_ERR_NOT_SUPPORTED saying why (the
 * driver's CUDA_ERROR_INVALID_VALUE names no reason). Through the op table such
 * a device looks as the sim does without GCA_SIM_FABRIC (Note [Sim fabric
 * handles]). */

/* Pinned device memory on `dev`, exportable as a POSIX fd where supported and
 * as a fabric handle while `fabric` is set. */
static CUmemAllocationProp alloc_prop(int dev, bool fabric) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  unsigned types = gca__cuda_lib.dev[dev].fd_support ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                                     : CU_MEM_HANDLE_TYPE_NONE;
  if (fabric)
    types |= CU_MEM_HANDLE_TYPE_FABRIC;
  prop.requestedHandleTypes = (CUmemAllocationHandleType)types;
  return prop;
}

/* 1, 0 or GCA__FABRIC_UNSETTLED (Note [Fabric handles]). */
static int fabric_state(int dev) {
  return atomic_load_explicit(&gca__cuda_lib.dev[dev].fabric, memory_order_acquire);
}

static bool wants_fabric(int dev) {
  return fabric_state(dev) != 0;
}

/* Whether cuMemCreate's r refuses the fabric request (Note [Fabric handles]). */
static bool fabric_refused(CUresult r) {
  return r == CUDA_ERROR_NOT_PERMITTED || r == CUDA_ERROR_NOT_SUPPORTED;
}

/* Settles dev's fabric state from a create that requested fabric handles and
 * returned r (a success or a refusal). */
static void fabric_learn(const char *op, int dev, CUresult r) {
  gca__cuda_device_t *d = &gca__cuda_lib.dev[dev];
  if (r == CUDA_SUCCESS) {
    int unsettled = GCA__FABRIC_UNSETTLED;
    atomic_compare_exchange_strong_explicit(&d->fabric, &unsettled, 1, memory_order_release,
                                            memory_order_relaxed);
    return;
  }
  char what[256];
  GCA_LOG_INFO("%s: device %d refused fabric handles (%s); creating memory without them from "
               "now on (Note [Fabric handles])",
               op, dev, gca__cuda_describe(r, what, sizeof(what)));
  atomic_store_explicit(&d->fabric_refusal, (int)r, memory_order_relaxed);
  atomic_store_explicit(&d->fabric, 0, memory_order_release);
}

gca_status_t gca__cuda_fabric_supported(int dev, int *out) {
  GCA_CHECK(gca__cuda_check_dev("device_attr", dev));
  if (fabric_state(dev) == GCA__FABRIC_UNSETTLED) {
    char op[96];
    snprintf(op, sizeof(op), "device_attr: probing device %d for fabric handles", dev);
    CUmemAllocationProp prop = alloc_prop(dev, true);
    CUmemGenericAllocationHandle h = 0;
    size_t g = 0;
    CU_CHECK(
        op, gca__cuda_drv.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUresult r = gca__cuda_drv.MemCreate(&h, g, &prop, 0);
    if (r != CUDA_SUCCESS && !fabric_refused(r))
      return gca__cuda_error(op, r);
    fabric_learn(op, dev, r);
    if (r == CUDA_SUCCESS)
      CU_CHECK(op, gca__cuda_drv.MemRelease(h));
  }
  *out = fabric_state(dev) == 1;
  return GCA_OK;
}

static gca_status_t cuda_mem_granularity(int dev, bool recommended, size_t *granularity) {
  GCA_CHECK(gca__cuda_check_dev("mem_granularity", dev));
  CUmemAllocationProp prop = alloc_prop(dev, wants_fabric(dev));
  CU_CHECK("mem_granularity", gca__cuda_drv.MemGetAllocationGranularity(
                                  granularity, &prop,
                                  recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                                              : CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return GCA_OK;
}

static gca_status_t cuda_mem_address_reserve(int dev, size_t size, size_t alignment,
                                             gca_devptr_t *out) {
  GCA_CHECK(gca__cuda_check_dev("mem_address_reserve", dev));
  CUdeviceptr p = 0;
  CU_CHECK("mem_address_reserve", gca__cuda_drv.MemAddressReserve(&p, size, alignment, 0, 0));
  *out = (gca_devptr_t)p;
  return GCA_OK;
}

static gca_status_t cuda_mem_address_free(int dev, gca_devptr_t ptr, size_t size) {
  GCA_CHECK(gca__cuda_check_dev("mem_address_free", dev));
  CU_CHECK("mem_address_free", gca__cuda_drv.MemAddressFree((CUdeviceptr)ptr, size));
  return GCA_OK;
}

static gca_status_t cuda_mem_create(int dev, size_t size, gca_memhandle_t *out) {
  GCA_CHECK(gca__cuda_check_dev("mem_create", dev));
  int fabric = fabric_state(dev);
  CUmemAllocationProp prop = alloc_prop(dev, fabric != 0);
  CUmemGenericAllocationHandle h = 0;
  CUresult r = gca__cuda_drv.MemCreate(&h, size, &prop, 0);
  if (fabric != 0 && fabric_refused(r)) {
    fabric_learn("mem_create", dev, r);
    prop = alloc_prop(dev, false);
    r = gca__cuda_drv.MemCreate(&h, size, &prop, 0);
  } else if (fabric == GCA__FABRIC_UNSETTLED && r == CUDA_SUCCESS) {
    fabric_learn("mem_create", dev, r);
  }
  CU_CHECK("mem_create", r);
  *out = (gca_memhandle_t)h;
  return GCA_OK;
}

static gca_status_t cuda_mem_release(gca_memhandle_t handle) {
  GCA_CHECK(gca__cuda_ready("mem_release"));
  CU_CHECK("mem_release", gca__cuda_drv.MemRelease((CUmemGenericAllocationHandle)handle));
  return GCA_OK;
}

static gca_status_t cuda_mem_map(gca_devptr_t ptr, size_t size, size_t offset,
                                 gca_memhandle_t handle) {
  GCA_CHECK(gca__cuda_ready("mem_map"));
  CU_CHECK("mem_map", gca__cuda_drv.MemMap((CUdeviceptr)ptr, size, offset,
                                           (CUmemGenericAllocationHandle)handle, 0));
  return GCA_OK;
}

static gca_status_t cuda_mem_unmap(gca_devptr_t ptr, size_t size) {
  GCA_CHECK(gca__cuda_ready("mem_unmap"));
  CU_CHECK("mem_unmap", gca__cuda_drv.MemUnmap((CUdeviceptr)ptr, size));
  return GCA_OK;
}

static gca_status_t cuda_mem_set_access(gca_devptr_t ptr, size_t size, const int *devs, int ndevs) {
  GCA_CHECK(gca__cuda_ready("mem_set_access"));
  if (!devs || ndevs <= 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_set_access: no devices given for 0x%llx",
                      (unsigned long long)ptr);
  for (int i = 0; i < ndevs; i++)
    GCA_CHECK(gca__cuda_check_dev("mem_set_access", devs[i]));
  CUmemAccessDesc *desc = calloc((size_t)ndevs, sizeof(*desc));
  if (!desc)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_set_access: cannot allocate %d descriptors",
                      ndevs);
  for (int i = 0; i < ndevs; i++) {
    desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[i].location.id = devs[i];
    desc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  gca_status_t st = GCA_OK;
  CU_CHECK_GOTO("mem_set_access",
                gca__cuda_drv.MemSetAccess((CUdeviceptr)ptr, size, desc, (size_t)ndevs), st,
                out_free);
out_free:
  free(desc);
  return st;
}

static gca_status_t cuda_mem_export_fd(gca_memhandle_t handle, int *fd) {
  GCA_CHECK(gca__cuda_ready("mem_export_fd"));
  if (!gca__cuda_drv.MemExportToShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fd: the driver lacks cuMemExportToShareableHandle");
  int out = -1;
  CU_CHECK("mem_export_fd",
           gca__cuda_drv.MemExportToShareableHandle(&out, (CUmemGenericAllocationHandle)handle,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  *fd = out;
  return GCA_OK;
}

static gca_status_t cuda_mem_import_fd(int dev, int fd, gca_memhandle_t *out) {
  GCA_CHECK(gca__cuda_check_dev("mem_import_fd", dev));
  if (!gca__cuda_drv.MemImportFromShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_import_fd: the driver lacks cuMemImportFromShareableHandle");
  CUmemGenericAllocationHandle h = 0;
  CU_CHECK("mem_import_fd",
           gca__cuda_drv.MemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  *out = (gca_memhandle_t)h;
  return GCA_OK;
}

/* GCA_ERR_NOT_SUPPORTED saying why when `handle` was made without fabric
 * handles (Note [Fabric handles]); GCA_OK when it was, or that cannot be told. */
static gca_status_t made_without_fabric(gca_memhandle_t handle) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  if (!gca__cuda_drv.MemGetAllocationPropertiesFromHandle ||
      gca__cuda_drv.MemGetAllocationPropertiesFromHandle(
          &prop, (CUmemGenericAllocationHandle)handle) != CUDA_SUCCESS ||
      (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC))
    return GCA_OK;
  int dev = prop.location.id;
  if (dev < 0 || dev >= gca__cuda_lib.ndev || fabric_state(dev) != 0)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fabric: handle 0x%llx was made without fabric handles",
                      (unsigned long long)handle);
  CUresult why =
      (CUresult)atomic_load_explicit(&gca__cuda_lib.dev[dev].fabric_refusal, memory_order_relaxed);
  char what[256];
  if (why != CUDA_SUCCESS)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fabric: handle 0x%llx was made without fabric handles: device "
                      "%d refused them (no IMEX channel for this process; cuMemCreate with "
                      "fabric handles requested answered %s)",
                      (unsigned long long)handle, dev, gca__cuda_describe(why, what, sizeof(what)));
  return gca__error(GCA_ERR_NOT_SUPPORTED,
                    "mem_export_fabric: handle 0x%llx was made without fabric handles: device %d "
                    "does not offer them (GCA_ATTR_FABRIC_SUPPORTED is 0)",
                    (unsigned long long)handle, dev);
}

static gca_status_t cuda_mem_export_fabric(gca_memhandle_t handle,
                                           uint8_t out[GCA_FABRIC_HANDLE_LEN]) {
  GCA_CHECK(gca__cuda_ready("mem_export_fabric"));
  if (!gca__cuda_drv.MemExportToShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fabric: the driver lacks cuMemExportToShareableHandle");
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_export_fabric: out is NULL");
  CUmemFabricHandle fh;
  _Static_assert(sizeof(fh.data) == GCA_FABRIC_HANDLE_LEN, "CUmemFabricHandle size");
  memset(&fh, 0, sizeof(fh));
  CUresult r = gca__cuda_drv.MemExportToShareableHandle(&fh, (CUmemGenericAllocationHandle)handle,
                                                        CU_MEM_HANDLE_TYPE_FABRIC, 0);
  if (r == CUDA_ERROR_INVALID_VALUE)
    GCA_CHECK(made_without_fabric(handle));
  CU_CHECK("mem_export_fabric", r);
  memcpy(out, fh.data, GCA_FABRIC_HANDLE_LEN);
  return GCA_OK;
}

static gca_status_t cuda_mem_import_fabric(int dev, const uint8_t in[GCA_FABRIC_HANDLE_LEN],
                                           gca_memhandle_t *out) {
  GCA_CHECK(gca__cuda_check_dev("mem_import_fabric", dev));
  if (!gca__cuda_drv.MemImportFromShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_import_fabric: the driver lacks cuMemImportFromShareableHandle");
  if (!in || !out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_import_fabric: %s is NULL", in ? "out" : "in");
  CUmemFabricHandle fh;
  memcpy(fh.data, in, GCA_FABRIC_HANDLE_LEN);
  CUmemGenericAllocationHandle h = 0;
  CU_CHECK("mem_import_fabric",
           gca__cuda_drv.MemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC));
  *out = (gca_memhandle_t)h;
  return GCA_OK;
}

/* ---- pinned host memory ---- */

/* GCA_ERR_NOT_SUPPORTED naming op when the driver lacks the entry point. */
static gca_status_t host_entry(const char *op, const void *fn, const char *name) {
  GCA_CHECK(gca__cuda_enter_any(op));
  if (!fn)
    return gca__error(GCA_ERR_NOT_SUPPORTED, "%s: the driver has no %s", op, name);
  return GCA_OK;
}

static gca_status_t cuda_host_alloc(size_t size, void **out) {
  GCA_CHECK(host_entry("host_alloc", (const void *)gca__cuda_drv.MemHostAlloc, "cuMemHostAlloc"));
  void *p = NULL;
  CU_CHECK("host_alloc", gca__cuda_drv.MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE));
  *out = p;
  return GCA_OK;
}

static gca_status_t cuda_host_free(void *ptr) {
  GCA_CHECK(host_entry("host_free", (const void *)gca__cuda_drv.MemFreeHost, "cuMemFreeHost"));
  CU_CHECK("host_free", gca__cuda_drv.MemFreeHost(ptr));
  return GCA_OK;
}

static gca_status_t cuda_host_register(void *ptr, size_t size) {
  GCA_CHECK(host_entry("host_register", (const void *)gca__cuda_drv.MemHostRegister,
                       "cuMemHostRegister"));
  CU_CHECK("host_register", gca__cuda_drv.MemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE));
  return GCA_OK;
}

static gca_status_t cuda_host_unregister(void *ptr) {
  GCA_CHECK(host_entry("host_unregister", (const void *)gca__cuda_drv.MemHostUnregister,
                       "cuMemHostUnregister"));
  CU_CHECK("host_unregister", gca__cuda_drv.MemHostUnregister(ptr));
  return GCA_OK;
}

void gca__cuda_mem_ops(gca_device_ops_t *ops) {
  ops->mem_get_info = cuda_mem_get_info;
  ops->mem_alloc = cuda_mem_alloc;
  ops->mem_free = cuda_mem_free;
  ops->mem_granularity = cuda_mem_granularity;
  ops->mem_address_reserve = cuda_mem_address_reserve;
  ops->mem_address_free = cuda_mem_address_free;
  ops->mem_create = cuda_mem_create;
  ops->mem_release = cuda_mem_release;
  ops->mem_map = cuda_mem_map;
  ops->mem_unmap = cuda_mem_unmap;
  ops->mem_set_access = cuda_mem_set_access;
  ops->mem_export_fd = cuda_mem_export_fd;
  ops->mem_import_fd = cuda_mem_import_fd;
  ops->mem_export_fabric = cuda_mem_export_fabric;
  ops->mem_import_fabric = cuda_mem_import_fabric;
  ops->host_alloc = cuda_host_alloc;
  ops->host_free = cuda_host_free;
  ops->host_register = cuda_host_register;
  ops->host_unregister = cuda_host_unregister;
}

#endif /* GCA_CUDA_FULL */
