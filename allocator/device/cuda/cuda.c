/* SPDX-License-Identifier: Apache-2.0 */
/* cuda.c - the CUDA driver backend: the device operation table mapped onto the
 * driver API, which is loaded at run time so the build needs cuda.h only. This
 * file loads the driver and assembles the op table; the ops live in the files
 * of the module map in cuda_internal.h.
 *
 * The one idea: nothing is linked. init dlopen()s libcuda.so.1 (or
 * GCA_CUDA_LIBRARY), finds cuGetProcAddress with dlsym, and resolves every
 * other entry through it at an explicit ABI version, so the behaviour (and the
 * signature behind each pointer) is the one this backend was written against,
 * whatever driver is installed. Missing library, stub library, no device or a
 * driver older than 12.0 fail init with GCA_ERR_NO_DEVICE and a message naming
 * what was missing; every op afterwards returns that error instead of calling
 * through a null pointer.
 *
 * Built without cuda.h (or with one older than 12.0) the table still exists and
 * every op fails with GCA_ERR_NOT_SUPPORTED "built without cuda.h".
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#ifndef GCA_CUDA_FULL

/* ---- built without a usable cuda.h: every op says so ---- */

static gca_status_t unsupported(const char *op) {
#if defined(GCA_HAVE_CUDA_H) && GCA_HAVE_CUDA_H
  return gca__error(GCA_ERR_NOT_SUPPORTED,
                    "%s: built without cuda.h for CUDA 12.0 or newer (found %d)", op,
                    (int)CUDA_VERSION);
#else
  return gca__error(GCA_ERR_NOT_SUPPORTED, "%s: built without cuda.h", op);
#endif
}

#define STUB(name, ...)                          \
  static gca_status_t stub_##name(__VA_ARGS__) { \
    return unsupported(#name);                   \
  }
STUB(init, void)
STUB(device_count, int *count)
STUB(device_attr, int dev, gca_dev_attr_t attr, int *value)
STUB(device_name, int dev, char *name, size_t len)
STUB(device_can_access_peer, int dev, int peer, int *can)
STUB(mem_get_info, int dev, size_t *f, size_t *t)
STUB(mem_alloc, int dev, size_t size, gca_devptr_t *out)
STUB(mem_free, int dev, gca_devptr_t ptr)
STUB(mem_granularity, int dev, bool rec, size_t *g)
STUB(mem_address_reserve, int dev, size_t size, size_t align, gca_devptr_t *out)
STUB(mem_address_free, int dev, gca_devptr_t ptr, size_t size)
STUB(mem_create, int dev, size_t size, gca_memhandle_t *out)
STUB(mem_release, gca_memhandle_t h)
STUB(mem_map, gca_devptr_t ptr, size_t size, size_t off, gca_memhandle_t h)
STUB(mem_unmap, gca_devptr_t ptr, size_t size)
STUB(mem_set_access, gca_devptr_t ptr, size_t size, const int *devs, int ndevs)
STUB(mem_export_fd, gca_memhandle_t h, int *fd)
STUB(mem_import_fd, int dev, int fd, gca_memhandle_t *out)
STUB(ctx_synchronize, int dev)
STUB(stream_create, int dev, unsigned flags, int prio, gca_stream_t *out)
STUB(stream_destroy, gca_stream_t s)
STUB(stream_synchronize, gca_stream_t s)
STUB(stream_query, gca_stream_t s)
STUB(stream_wait_event, gca_stream_t s, gca_event_t e)
STUB(event_create, int dev, unsigned flags, gca_event_t *out)
STUB(event_destroy, gca_event_t e)
STUB(event_record, gca_event_t e, gca_stream_t s)
STUB(event_query, gca_event_t e)
STUB(event_synchronize, gca_event_t e)
STUB(event_elapsed, gca_event_t a, gca_event_t b, float *ms)
STUB(launch_host_func, gca_stream_t s, gca_host_fn_t fn, void *ud)
STUB(memcpy_async, gca_devptr_t d, gca_devptr_t s, size_t n, gca_stream_t st)
STUB(memset_d8_async, gca_devptr_t d, uint8_t v, size_t n, gca_stream_t s)
STUB(memset_d32_async, gca_devptr_t d, uint32_t v, size_t n, gca_stream_t s)
STUB(kernel_fill_u32, gca_devptr_t d, uint32_t v, uint32_t step, size_t n, gca_stream_t s)
STUB(kernel_add_u32, gca_devptr_t d, gca_devptr_t a, gca_devptr_t b, size_t n, gca_stream_t s)
STUB(kernel_sleep, uint64_t ns, gca_stream_t s)
STUB(stream_begin_capture, gca_stream_t s, gca_capture_mode_t mode)
STUB(stream_end_capture, gca_stream_t s, gca_graph_t *g)
STUB(stream_capture_info, gca_stream_t s, gca_capture_status_t *st, uint64_t *id)
STUB(thread_exchange_capture_mode, gca_capture_mode_t *mode)
STUB(graph_node_count, gca_graph_t g, size_t *n)
STUB(graph_instantiate, gca_graph_t g, gca_graph_exec_t *out)
STUB(graph_upload, gca_graph_exec_t e, gca_stream_t s)
STUB(graph_launch, gca_graph_exec_t e, gca_stream_t s)
STUB(graph_exec_update, gca_graph_exec_t e, gca_graph_t g, gca_graph_update_info_t *info)
STUB(graph_destroy, gca_graph_t g)
STUB(graph_exec_destroy, gca_graph_exec_t e)
STUB(mem_export_fabric, gca_memhandle_t h, uint8_t out[GCA_FABRIC_HANDLE_LEN])
STUB(mem_import_fabric, int dev, const uint8_t in[GCA_FABRIC_HANDLE_LEN], gca_memhandle_t *out)
STUB(ctx_set_device, int dev)
STUB(ctx_get_device, int *dev)
STUB(stream_get_device, gca_stream_t s, int *dev)
STUB(kernel_philox_u32, gca_devptr_t d, size_t n, gca_devptr_t seed, gca_devptr_t off, uint64_t add,
     gca_stream_t s)
STUB(ctx_enable_peer_access, int dev, int peer)
STUB(kernel_copy_batch, gca_devptr_t table, size_t n, gca_stream_t s)
STUB(host_alloc, size_t size, void **out)
STUB(host_free, void *ptr)
STUB(host_register, void *ptr, size_t size)
STUB(host_unregister, void *ptr)
STUB(kernel_gemm_f32, gca_devptr_t c, gca_devptr_t a, gca_devptr_t b, uint32_t m, uint32_t n,
     uint32_t k, uint32_t flags, gca_stream_t s)
STUB(kernel_ew_f32, gca_ew_op_t op, gca_devptr_t d, gca_devptr_t a, gca_devptr_t b, float sc,
     uint32_t u, size_t n, gca_stream_t s)
STUB(kernel_dot_f32, gca_devptr_t d, gca_devptr_t a, gca_devptr_t b, size_t n, float sc,
     gca_stream_t s)
#undef STUB

static const gca_device_ops_t cuda_ops = {.name = "cuda",
#define SLOT(name) .name = stub_##name,
                                          GCA_DEVICE_OP_MAP(SLOT)
#undef SLOT
};

const gca_device_ops_t *gca__cuda_ops(void) {
  return &cuda_ops;
}

void *gca__cuda_driver_symbol(const char *name) {
  (void)name;
  return NULL;
}

#else /* GCA_CUDA_FULL */

#define DEFAULT_LIBRARY    "libcuda.so.1"
#define MIN_DRIVER_VERSION 12000

/* ---- the driver's entry points ---- */

struct gca__cuda_driver gca__cuda_drv;

/* One entry point: the driver's name, the ABI version whose signature the slot
 * has (never above the installed driver's version, see resolve()), and whether
 * init fails without it. Optional entries leave their slot NULL and the op
 * that needs them returns GCA_ERR_NOT_SUPPORTED (or uses an alternative). */
typedef struct symbol {
  const char *name;
  int version;
  bool required;
  size_t slot;
} symbol_t;

#define SYM(field, name, version, required) \
  { name, version, required, offsetof(struct gca__cuda_driver, field) }

/* Resolved first: error reporting, cuInit and the version check. */
static const symbol_t bootstrap[] = {
    SYM(GetErrorName, "cuGetErrorName", 6000, true),
    SYM(GetErrorString, "cuGetErrorString", 6000, true),
    SYM(Init, "cuInit", 2000, true),
    SYM(DriverGetVersion, "cuDriverGetVersion", 2020, true),
};

static const symbol_t symbols[] = {
    SYM(DeviceGet, "cuDeviceGet", 2000, true),
    SYM(DeviceGetCount, "cuDeviceGetCount", 2000, true),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute", 2000, true),
    SYM(DeviceGetName, "cuDeviceGetName", 2000, true),
    SYM(DeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000, true),
    SYM(CtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, true),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, true),
    SYM(CtxGetCurrent, "cuCtxGetCurrent", 4000, true),
    SYM(CtxSetCurrent, "cuCtxSetCurrent", 4000, true),
    SYM(CtxGetDevice, "cuCtxGetDevice", 2000, true),
    SYM(CtxSynchronize, "cuCtxSynchronize", 2000, true), /* the current context's form */
    SYM(MemGetInfo, "cuMemGetInfo", 3020, true),         /* _v2: size_t */
    SYM(MemAlloc, "cuMemAlloc", 3020, true),             /* _v2: 64-bit CUdeviceptr */
    SYM(MemFree, "cuMemFree", 3020, true),
    SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020, true),
    SYM(MemAddressReserve, "cuMemAddressReserve", 10020, true),
    SYM(MemAddressFree, "cuMemAddressFree", 10020, true),
    SYM(MemCreate, "cuMemCreate", 10020, true),
    SYM(MemRelease, "cuMemRelease", 10020, true),
    SYM(MemMap, "cuMemMap", 10020, true),
    SYM(MemUnmap, "cuMemUnmap", 10020, true),
    SYM(MemSetAccess, "cuMemSetAccess", 10020, true),
    SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, false),
    SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, false),
    SYM(MemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle", 10020,
        false),
    SYM(StreamCreateWithPriority, "cuStreamCreateWithPriority", 5050, true),
    SYM(StreamDestroy, "cuStreamDestroy", 4000, true), /* _v2 */
    SYM(StreamSynchronize, "cuStreamSynchronize", 2000, true),
    SYM(StreamQuery, "cuStreamQuery", 2000, true),
    SYM(StreamWaitEvent, "cuStreamWaitEvent", 3020, true),
    SYM(StreamGetCtx, "cuStreamGetCtx", 9020, true),
    SYM(EventCreate, "cuEventCreate", 2000, true),
    SYM(EventDestroy, "cuEventDestroy", 4000, true), /* _v2 */
    SYM(EventRecord, "cuEventRecord", 2000, true),
    SYM(EventQuery, "cuEventQuery", 2000, true),
    SYM(EventSynchronize, "cuEventSynchronize", 2000, true),
    SYM(EventElapsedTime_v2, "cuEventElapsedTime", 12080, false),
    SYM(EventElapsedTime_v1, "cuEventElapsedTime", 2000, true),
    SYM(LaunchHostFunc, "cuLaunchHostFunc", 10000, true),
    SYM(MemcpyAsync, "cuMemcpyAsync", 4000, true),
    SYM(MemsetD8Async, "cuMemsetD8Async", 3020, true),
    SYM(MemsetD32Async, "cuMemsetD32Async", 3020, true),
    SYM(ModuleLoadData, "cuModuleLoadData", 2000, true),
    SYM(ModuleGetFunction, "cuModuleGetFunction", 2000, true),
    SYM(LaunchKernel, "cuLaunchKernel", 4000, true),
    SYM(StreamBeginCapture, "cuStreamBeginCapture", 10010, true), /* _v2: with mode */
    SYM(StreamEndCapture, "cuStreamEndCapture", 10000, true),
    SYM(StreamGetCaptureInfo_v3, "cuStreamGetCaptureInfo", 12030, false),
    SYM(StreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo", 11030, true),
    SYM(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010, true),
    SYM(GraphGetNodes, "cuGraphGetNodes", 10000, true),
    /* What cuda.h 12+ calls cuGraphInstantiate; asked for by its unambiguous name. */
    SYM(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, true),
    SYM(GraphUpload, "cuGraphUpload", 11010, false),
    SYM(GraphLaunch, "cuGraphLaunch", 10000, true),
    SYM(GraphExecUpdate, "cuGraphExecUpdate", 12000, true), /* _v2: result info struct */
    SYM(GraphDestroy, "cuGraphDestroy", 10000, true),
    SYM(GraphExecDestroy, "cuGraphExecDestroy", 10000, true),
    /* pinned host memory: optional, the host allocator alone needs them */
    SYM(MemHostAlloc, "cuMemHostAlloc", 3020, false),
    SYM(MemFreeHost, "cuMemFreeHost", 2000, false),
    SYM(MemHostRegister, "cuMemHostRegister", 6050, false), /* _v2 */
    SYM(MemHostUnregister, "cuMemHostUnregister", 4000, false),
};
#undef SYM

/* ---- state ---- */

gca__cuda_lib_t gca__cuda_lib = {.once = PTHREAD_ONCE_INIT};

pthread_mutex_t gca__cuda_dev_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- errors ---- */

/* Names of the results this backend is likely to meet before cuGetErrorName
 * works (the stub library and a failed cuGetProcAddress answer none). */
#define KNOWN_RESULTS(X)                       \
  X(CUDA_SUCCESS)                              \
  X(CUDA_ERROR_INVALID_VALUE)                  \
  X(CUDA_ERROR_OUT_OF_MEMORY)                  \
  X(CUDA_ERROR_NOT_INITIALIZED)                \
  X(CUDA_ERROR_DEINITIALIZED)                  \
  X(CUDA_ERROR_STUB_LIBRARY)                   \
  X(CUDA_ERROR_NO_DEVICE)                      \
  X(CUDA_ERROR_INVALID_DEVICE)                 \
  X(CUDA_ERROR_INVALID_CONTEXT)                \
  X(CUDA_ERROR_INVALID_HANDLE)                 \
  X(CUDA_ERROR_NOT_FOUND)                      \
  X(CUDA_ERROR_NOT_READY)                      \
  X(CUDA_ERROR_NOT_SUPPORTED)                  \
  X(CUDA_ERROR_NOT_PERMITTED)                  \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)         \
  X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) \
  X(CUDA_ERROR_OPERATING_SYSTEM)               \
  X(CUDA_ERROR_ILLEGAL_STATE)                  \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)     \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)     \
  X(CUDA_ERROR_UNKNOWN)

static const char *fallback_name(CUresult r) {
  switch (r) {
#define NAME_CASE(n) \
  case n:            \
    return #n;
    KNOWN_RESULTS(NAME_CASE)
#undef NAME_CASE
  default:
    return "CUDA_ERROR_UNRECOGNIZED";
  }
}

static gca_status_t map_result(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS:
    return GCA_OK;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return GCA_ERR_OUT_OF_MEMORY;
  case CUDA_ERROR_INVALID_VALUE:
    return GCA_ERR_INVALID_ARGUMENT;
  case CUDA_ERROR_INVALID_HANDLE:
    return GCA_ERR_INVALID_HANDLE;
  case CUDA_ERROR_NOT_READY:
    return GCA_ERR_NOT_READY;
  case CUDA_ERROR_NOT_SUPPORTED:
    return GCA_ERR_NOT_SUPPORTED;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    return GCA_ERR_CAPTURE_UNSUPPORTED;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    return GCA_ERR_CAPTURE_INVALIDATED;
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    return GCA_ERR_CAPTURE_IMPLICIT;
  case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    return GCA_ERR_CAPTURE_UNMATCHED;
  case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
    return GCA_ERR_CAPTURE_WRONG_THREAD;
  case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
    return GCA_ERR_CAPTURE_UNJOINED;
  case CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
    return GCA_ERR_GRAPH_UPDATE;
  case CUDA_ERROR_NOT_PERMITTED:
    return GCA_ERR_NOT_PERMITTED;
  case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
    return GCA_ERR_INVALID_STATE;
  case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
    return GCA_ERR_INVALID_ARGUMENT;
  case CUDA_ERROR_ILLEGAL_ADDRESS:
    return GCA_ERR_ILLEGAL_ADDRESS;
  case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
    return GCA_ERR_INVALID_STATE;
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
    return GCA_ERR_NOT_SUPPORTED;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_NOT_INITIALIZED:
  case CUDA_ERROR_STUB_LIBRARY:
    return GCA_ERR_NO_DEVICE;
  default:
    return GCA_ERR_DRIVER;
  }
}

/* Writes "NAME (description)" for `r` into buf, asking the driver when it can. */
const char *gca__cuda_describe(CUresult r, char *buf, size_t len) {
  const char *name = NULL, *desc = NULL;
  if (!gca__cuda_drv.GetErrorName || gca__cuda_drv.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
    name = fallback_name(r);
  if (!gca__cuda_drv.GetErrorString || gca__cuda_drv.GetErrorString(r, &desc) != CUDA_SUCCESS ||
      !desc)
    desc = NULL;
  if (desc)
    snprintf(buf, len, "%s (%s)", name, desc);
  else
    snprintf(buf, len, "%s (error %d)", name, (int)r);
  return buf;
}

/* Sets the detail "<op>: NAME (description)" and returns the mapped status. */
gca_status_t gca__cuda_error(const char *op, CUresult r) {
  char what[256];
  return gca__error(map_result(r), "%s: %s", op, gca__cuda_describe(r, what, sizeof(what)));
}

/* ---- loading ---- */

/* Resolves `name` at `version` into *out. Returns the driver's result; *out is
 * NULL when the driver has no entry ABI-compatible with that version. A version
 * above the installed driver's is not asked for (the driver would refuse it
 * with CUDA_ERROR_INVALID_VALUE): such an entry is simply absent. */
static CUresult resolve(const char *name, int version, void **out) {
  *out = NULL;
  if (gca__cuda_lib.driver_version && version > gca__cuda_lib.driver_version)
    return CUDA_SUCCESS;
  CUresult r;
  if (gca__cuda_lib.getproc_v2) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    r = gca__cuda_lib.getproc_v2(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS)
      *out = NULL;
  } else {
    r = gca__cuda_lib.getproc_v1(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT);
  }
  if (r == CUDA_ERROR_NOT_FOUND) {
    *out = NULL;
    return CUDA_SUCCESS;
  }
  if (r != CUDA_SUCCESS)
    *out = NULL;
  return r;
}

static gca_status_t resolve_all(const symbol_t *syms, size_t n) {
  for (size_t i = 0; i < n; i++) {
    void *p = NULL;
    CUresult r = resolve(syms[i].name, syms[i].version, &p);
    if (r != CUDA_SUCCESS) {
      char what[256];
      return gca__error(GCA_ERR_NO_DEVICE, "init: cuGetProcAddress(\"%s\", %d) in %s failed: %s",
                        syms[i].name, syms[i].version, gca__cuda_lib.path,
                        gca__cuda_describe(r, what, sizeof(what)));
    }
    if (!p && syms[i].required)
      return gca__error(GCA_ERR_NO_DEVICE,
                        "init: the driver in %s (CUDA %d.%d) lacks %s at ABI version %d",
                        gca__cuda_lib.path, gca__cuda_lib.driver_version / 1000,
                        gca__cuda_lib.driver_version % 1000 / 10, syms[i].name, syms[i].version);
    memcpy((char *)&gca__cuda_drv + syms[i].slot, &p, sizeof(p));
  }
  return GCA_OK;
}

static gca_status_t open_library(void) {
  const char *path = gca__getenv("GCA_CUDA_LIBRARY");
  if (!path || !*path)
    path = DEFAULT_LIBRARY;
  snprintf(gca__cuda_lib.path, sizeof(gca__cuda_lib.path), "%s", path);
  dlerror();
  gca__cuda_lib.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!gca__cuda_lib.lib) {
    const char *why = dlerror();
    return gca__error(GCA_ERR_NO_DEVICE, "init: cannot load the CUDA driver library %s: %s", path,
                      why ? why : "unknown dlopen failure");
  }
  gca__cuda_lib.getproc_v2 =
      (gca__cuda_getproc_v2_fn)dlsym(gca__cuda_lib.lib, "cuGetProcAddress_v2");
  if (!gca__cuda_lib.getproc_v2)
    gca__cuda_lib.getproc_v1 =
        (gca__cuda_getproc_v1_fn)dlsym(gca__cuda_lib.lib, "cuGetProcAddress");
  if (!gca__cuda_lib.getproc_v2 && !gca__cuda_lib.getproc_v1)
    return gca__error(GCA_ERR_NO_DEVICE,
                      "init: %s has no cuGetProcAddress_v2 or cuGetProcAddress (not a CUDA "
                      "driver, or one older than CUDA 11.3)",
                      path);
  return GCA_OK;
}

static gca_status_t load_devices(void) {
  int n = 0;
  CU_CHECK("init: cuDeviceGetCount", gca__cuda_drv.DeviceGetCount(&n));
  if (n <= 0)
    return gca__error(GCA_ERR_NO_DEVICE, "init: the driver in %s reports no CUDA device",
                      gca__cuda_lib.path);
  gca__cuda_lib.dev = calloc((size_t)n, sizeof(*gca__cuda_lib.dev));
  if (!gca__cuda_lib.dev)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "init: cannot allocate state for %d devices", n);
  for (int i = 0; i < n; i++) {
    CU_CHECK("init: cuDeviceGet", gca__cuda_drv.DeviceGet(&gca__cuda_lib.dev[i].cudev, i));
    int fd = 0;
    if (gca__cuda_drv.DeviceGetAttribute(
            &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            gca__cuda_lib.dev[i].cudev) != CUDA_SUCCESS)
      fd = 0;
    gca__cuda_lib.dev[i].fd_support = fd != 0;
    int fabric = 0;
    if (gca__cuda_drv.DeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                                         gca__cuda_lib.dev[i].cudev) != CUDA_SUCCESS)
      fabric = 0;
    atomic_store_explicit(&gca__cuda_lib.dev[i].fabric, fabric ? GCA__FABRIC_UNSETTLED : 0,
                          memory_order_relaxed);
  }
  gca__cuda_lib.ndev = n;
  return GCA_OK;
}

static gca_status_t load_driver(void) {
  GCA_CHECK(open_library());
  GCA_CHECK(resolve_all(bootstrap, GCA_ARRAY_SIZE(bootstrap)));
  char what[256];
  CUresult r = gca__cuda_drv.Init(0);
  if (r != CUDA_SUCCESS)
    return gca__error(GCA_ERR_NO_DEVICE, "init: cuInit in %s failed: %s", gca__cuda_lib.path,
                      gca__cuda_describe(r, what, sizeof(what)));
  r = gca__cuda_drv.DriverGetVersion(&gca__cuda_lib.driver_version);
  if (r != CUDA_SUCCESS)
    return gca__error(GCA_ERR_NO_DEVICE, "init: cuDriverGetVersion in %s failed: %s",
                      gca__cuda_lib.path, gca__cuda_describe(r, what, sizeof(what)));
  if (gca__cuda_lib.driver_version < MIN_DRIVER_VERSION)
    return gca__error(GCA_ERR_NO_DEVICE,
                      "init: the driver in %s supports CUDA %d.%d; gca needs %d.%d or newer",
                      gca__cuda_lib.path, gca__cuda_lib.driver_version / 1000,
                      gca__cuda_lib.driver_version % 1000 / 10, MIN_DRIVER_VERSION / 1000,
                      MIN_DRIVER_VERSION % 1000 / 10);
  GCA_CHECK(resolve_all(symbols, GCA_ARRAY_SIZE(symbols)));
  return load_devices();
}

/* The library once init succeeded, for gca__cuda_driver_symbol (which must
 * not start init itself); NULL before that and after a failed init. */
static void *_Atomic loaded_lib;

static void run_init(void) {
  gca__cuda_lib.status = load_driver();
  if (gca__cuda_lib.status == GCA_OK) {
    atomic_store_explicit(&loaded_lib, gca__cuda_lib.lib, memory_order_release);
    return;
  }
  snprintf(gca__cuda_lib.detail, sizeof(gca__cuda_lib.detail), "%s", gca_last_error());
  free(gca__cuda_lib.dev);
  gca__cuda_lib.dev = NULL;
  gca__cuda_lib.ndev = 0;
  if (gca__cuda_lib.lib)
    dlclose(gca__cuda_lib.lib);
  gca__cuda_lib.lib = NULL;
  memset(&gca__cuda_drv, 0, sizeof(gca__cuda_drv));
}

gca_status_t gca__cuda_ready(const char *op) {
  pthread_once(&gca__cuda_lib.once, run_init);
  if (GCA_UNLIKELY(gca__cuda_lib.status != GCA_OK))
    return gca__error(gca__cuda_lib.status, "%s: cuda backend unavailable: %s", op,
                      gca__cuda_lib.detail);
  return GCA_OK;
}

void *gca__cuda_driver_symbol(const char *name) {
  void *lib = atomic_load_explicit(&loaded_lib, memory_order_acquire);
  return lib ? dlsym(lib, name) : NULL;
}

static gca_status_t cuda_init(void) {
  pthread_once(&gca__cuda_lib.once, run_init);
  if (gca__cuda_lib.status != GCA_OK)
    return gca__error(gca__cuda_lib.status, "%s", gca__cuda_lib.detail);
  return GCA_OK;
}

/* ---- the op table ---- */

static gca_device_ops_t cuda_ops;
static pthread_once_t cuda_ops_once = PTHREAD_ONCE_INIT;

static void fill_ops(void) {
  cuda_ops.name = "cuda";
  cuda_ops.init = cuda_init;
  gca__cuda_device_ops(&cuda_ops);
  gca__cuda_mem_ops(&cuda_ops);
  gca__cuda_stream_ops(&cuda_ops);
  gca__cuda_graph_ops(&cuda_ops);
  gca__cuda_kernel_ops(&cuda_ops);
}

const gca_device_ops_t *gca__cuda_ops(void) {
  pthread_once(&cuda_ops_once, fill_ops);
  return &cuda_ops;
}

#endif /* GCA_CUDA_FULL */
