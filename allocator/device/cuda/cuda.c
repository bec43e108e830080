/* SPDX-License-Identifier: Apache-2.0 */
/* cuda.c - the CUDA driver backend: the device operation table mapped onto the
 * driver API, which is loaded at run time so the build needs cuda.h only.
 *
 * The one idea: nothing is linked. init dlopen()s libcuda.so.1 (or
 * GCA_CUDA_LIBRARY), finds cuGetProcAddress with dlsym, and resolves every
 * other entry through it at an explicit ABI version, so the behaviour (and the
 * signature behind each pointer) is the one this file was written against,
 * whatever driver is installed. Missing library, stub library, no device or a
 * driver older than 12.0 fail init with GCA_ERR_NO_DEVICE and a message naming
 * what was missing; every op afterwards returns that error instead of calling
 * through a null pointer.
 *
 * Note [Cuda contexts]: each device's primary context is retained lazily and
 * kept for the life of the process. Before acting, an op makes the right
 * context current on the calling thread: the device's for ops that name one,
 * the stream's (cuStreamGetCtx) for stream work, the thread's current device's
 * (ctx_set_device, default 0) for work on the NULL stream, and for ops on
 * events and graphs whatever is current, else the current device's.
 * cuCtxSetCurrent is called only when the thread's current context differs,
 * which is checked with cuCtxGetCurrent (a thread-local read in the driver)
 * rather than remembered, since the program may switch contexts behind our
 * back. The current device itself is remembered per thread: ops that name a
 * device switch the driver's current context, so the driver's cannot say
 * which device's legacy stream NULL means.
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

#include "device.h"

#if defined(GCA_HAVE_CUDA_H) && GCA_HAVE_CUDA_H
#include <cuda.h>
#if CUDA_VERSION >= 12000
#define GCA_CUDA_FULL 1
#endif
#endif

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

#else /* GCA_CUDA_FULL */

#include "cuda_ptx.h"

#define DEFAULT_LIBRARY    "libcuda.so.1"
#define MIN_DRIVER_VERSION 12000
#define KERNEL_BLOCK       256u
#define KERNEL_MAX_GRID    4096u
#define GEMM_TILE          16u

/* ---- the driver's entry points ---- */

typedef CUresult (*getproc_v2_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *found);
typedef CUresult (*getproc_v1_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags);

/* Every pointer has the signature of the ABI version it is resolved at (see
 * `symbols` below); suffixes _v<n> name alternatives of one entry point. */
static struct driver {
  CUresult (*Init)(unsigned int flags);
  CUresult (*DriverGetVersion)(int *version);
  CUresult (*GetErrorName)(CUresult error, const char **str);
  CUresult (*GetErrorString)(CUresult error, const char **str);
  CUresult (*DeviceGet)(CUdevice *device, int ordinal);
  CUresult (*DeviceGetCount)(int *count);
  CUresult (*DeviceGetAttribute)(int *pi, CUdevice_attribute attrib, CUdevice dev);
  CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
  CUresult (*DeviceCanAccessPeer)(int *can, CUdevice dev, CUdevice peer);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *pctx, CUdevice dev);
  CUresult (*CtxGetCurrent)(CUcontext *pctx);
  CUresult (*CtxSetCurrent)(CUcontext ctx);
  CUresult (*CtxGetDevice)(CUdevice *device);
  CUresult (*CtxSynchronize)(void);
  CUresult (*CtxEnablePeerAccess)(CUcontext peer, unsigned int flags);
  CUresult (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
  CUresult (*MemAlloc)(CUdeviceptr *dptr, size_t size);
  CUresult (*MemFree)(CUdeviceptr dptr);
  CUresult (*MemGetAllocationGranularity)(size_t *granularity, const CUmemAllocationProp *prop,
                                          CUmemAllocationGranularity_flags option);
  CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                unsigned long long flags);
  CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t size);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *handle, size_t size,
                        const CUmemAllocationProp *prop, unsigned long long flags);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle handle);
  CUresult (*MemMap)(CUdeviceptr ptr, size_t size, size_t offset,
                     CUmemGenericAllocationHandle handle, unsigned long long flags);
  CUresult (*MemUnmap)(CUdeviceptr ptr, size_t size);
  CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
  CUresult (*MemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle handle,
                                         CUmemAllocationHandleType type, unsigned long long flags);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *handle, void *shareable,
                                           CUmemAllocationHandleType type);
  CUresult (*StreamCreateWithPriority)(CUstream *stream, unsigned int flags, int priority);
  CUresult (*StreamDestroy)(CUstream stream);
  CUresult (*StreamSynchronize)(CUstream stream);
  CUresult (*StreamQuery)(CUstream stream);
  CUresult (*StreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
  CUresult (*StreamGetCtx)(CUstream stream, CUcontext *pctx);
  CUresult (*EventCreate)(CUevent *event, unsigned int flags);
  CUresult (*EventDestroy)(CUevent event);
  CUresult (*EventRecord)(CUevent event, CUstream stream);
  CUresult (*EventQuery)(CUevent event);
  CUresult (*EventSynchronize)(CUevent event);
  CUresult (*EventElapsedTime_v1)(float *ms, CUevent start, CUevent end);
  CUresult (*EventElapsedTime_v2)(float *ms, CUevent start, CUevent end);
  CUresult (*LaunchHostFunc)(CUstream stream, CUhostFn fn, void *user_data);
  CUresult (*MemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream);
  CUresult (*MemsetD32Async)(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream);
  CUresult (*ModuleLoadData)(CUmodule *module, const void *image);
  CUresult (*ModuleGetFunction)(CUfunction *fn, CUmodule module, const char *name);
  CUresult (*LaunchKernel)(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned shared_bytes, CUstream stream,
                           void **params, void **extra);
  CUresult (*StreamBeginCapture)(CUstream stream, CUstreamCaptureMode mode);
  CUresult (*StreamEndCapture)(CUstream stream, CUgraph *graph);
  CUresult (*StreamGetCaptureInfo_v2)(CUstream stream, CUstreamCaptureStatus *status,
                                      cuuint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                                      size_t *ndeps);
  CUresult (*StreamGetCaptureInfo_v3)(CUstream stream, CUstreamCaptureStatus *status,
                                      cuuint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                                      const void **edge_data, size_t *ndeps);
  CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *mode);
  CUresult (*GraphGetNodes)(CUgraph graph, CUgraphNode *nodes, size_t *count);
  CUresult (*GraphInstantiateWithFlags)(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
  CUresult (*GraphUpload)(CUgraphExec exec, CUstream stream);
  CUresult (*GraphLaunch)(CUgraphExec exec, CUstream stream);
  CUresult (*GraphExecUpdate)(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info);
  CUresult (*GraphDestroy)(CUgraph graph);
  CUresult (*GraphExecDestroy)(CUgraphExec exec);
  CUresult (*MemHostAlloc)(void **pp, size_t bytesize, unsigned int flags);
  CUresult (*MemFreeHost)(void *p);
  CUresult (*MemHostRegister)(void *p, size_t bytesize, unsigned int flags);
  CUresult (*MemHostUnregister)(void *p);
} drv;

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
  { name, version, required, offsetof(struct driver, field) }

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

/* Per device, filled lazily under dev_lock; once set, ctx, fd_support and
 * module/fns never change (read without the lock after an acquire load).
 * fabric goes from 1 to 0 at most once (Note [Fabric handles]). */
typedef struct cuda_device {
  CUdevice cudev;
  CUcontext _Atomic ctx; /* retained primary context, NULL until first use */
  int fd_support;        /* POSIX fd handles: 1 yes, 0 no (read at init) */
  int _Atomic fabric;    /* request fabric handles in mem_create: 1 yes, 0 no */
  CUmodule _Atomic module;
  CUfunction fn_fill, fn_add, fn_sleep, fn_philox, fn_copy; /* valid once module != NULL */
  CUfunction fn_gemm, fn_ew, fn_dot;
} cuda_device_t;

static struct {
  pthread_once_t once;
  gca_status_t status;
  char detail[512];
  char path[256];
  void *lib;
  getproc_v2_fn getproc_v2;
  getproc_v1_fn getproc_v1;
  int driver_version;
  int ndev;
  cuda_device_t *dev; /* [ndev] */
} cu = {.once = PTHREAD_ONCE_INIT};

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;

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
static const char *describe(CUresult r, char *buf, size_t len) {
  const char *name = NULL, *desc = NULL;
  if (!drv.GetErrorName || drv.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
    name = fallback_name(r);
  if (!drv.GetErrorString || drv.GetErrorString(r, &desc) != CUDA_SUCCESS || !desc)
    desc = NULL;
  if (desc)
    snprintf(buf, len, "%s (%s)", name, desc);
  else
    snprintf(buf, len, "%s (error %d)", name, (int)r);
  return buf;
}

/* Sets the detail "<op>: NAME (description)" and returns the mapped status. */
static gca_status_t cu_error(const char *op, CUresult r) {
  char what[256];
  return gca__error(map_result(r), "%s: %s", op, describe(r, what, sizeof(what)));
}

/* Check-and-propagate for driver calls (NCCL's CUCHECK). */
#define CU_CHECK(op, call)                                 \
  do {                                                     \
    CUresult cu_r_ = (call);                               \
    if (GCA_UNLIKELY(cu_r_ != CUDA_SUCCESS)) {             \
      gca_status_t cu_st_ = cu_error((op), cu_r_);         \
      gca__error_trace(__FILE__, __LINE__, #call, cu_st_); \
      return cu_st_;                                       \
    }                                                      \
  } while (0)

#define CU_CHECK_GOTO(op, call, st, label)               \
  do {                                                   \
    CUresult cu_r_ = (call);                             \
    if (GCA_UNLIKELY(cu_r_ != CUDA_SUCCESS)) {           \
      (st) = cu_error((op), cu_r_);                      \
      gca__error_trace(__FILE__, __LINE__, #call, (st)); \
      goto label;                                        \
    }                                                    \
  } while (0)

/* ---- loading ---- */

/* Resolves `name` at `version` into *out. Returns the driver's result; *out is
 * NULL when the driver has no entry ABI-compatible with that version. A version
 * above the installed driver's is not asked for (the driver would refuse it
 * with CUDA_ERROR_INVALID_VALUE): such an entry is simply absent. */
static CUresult resolve(const char *name, int version, void **out) {
  *out = NULL;
  if (cu.driver_version && version > cu.driver_version)
    return CUDA_SUCCESS;
  CUresult r;
  if (cu.getproc_v2) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    r = cu.getproc_v2(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS)
      *out = NULL;
  } else {
    r = cu.getproc_v1(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT);
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
                        syms[i].name, syms[i].version, cu.path, describe(r, what, sizeof(what)));
    }
    if (!p && syms[i].required)
      return gca__error(GCA_ERR_NO_DEVICE,
                        "init: the driver in %s (CUDA %d.%d) lacks %s at ABI version %d", cu.path,
                        cu.driver_version / 1000, cu.driver_version % 1000 / 10, syms[i].name,
                        syms[i].version);
    memcpy((char *)&drv + syms[i].slot, &p, sizeof(p));
  }
  return GCA_OK;
}

static gca_status_t open_library(void) {
  const char *path = gca__getenv("GCA_CUDA_LIBRARY");
  if (!path || !*path)
    path = DEFAULT_LIBRARY;
  snprintf(cu.path, sizeof(cu.path), "%s", path);
  dlerror();
  cu.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!cu.lib) {
    const char *why = dlerror();
    return gca__error(GCA_ERR_NO_DEVICE, "init: cannot load the CUDA driver library %s: %s", path,
                      why ? why : "unknown dlopen failure");
  }
  cu.getproc_v2 = (getproc_v2_fn)dlsym(cu.lib, "cuGetProcAddress_v2");
  if (!cu.getproc_v2)
    cu.getproc_v1 = (getproc_v1_fn)dlsym(cu.lib, "cuGetProcAddress");
  if (!cu.getproc_v2 && !cu.getproc_v1)
    return gca__error(GCA_ERR_NO_DEVICE,
                      "init: %s has no cuGetProcAddress_v2 or cuGetProcAddress (not a CUDA "
                      "driver, or one older than CUDA 11.3)",
                      path);
  return GCA_OK;
}

static gca_status_t load_devices(void) {
  int n = 0;
  CU_CHECK("init: cuDeviceGetCount", drv.DeviceGetCount(&n));
  if (n <= 0)
    return gca__error(GCA_ERR_NO_DEVICE, "init: the driver in %s reports no CUDA device", cu.path);
  cu.dev = calloc((size_t)n, sizeof(*cu.dev));
  if (!cu.dev)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "init: cannot allocate state for %d devices", n);
  for (int i = 0; i < n; i++) {
    CU_CHECK("init: cuDeviceGet", drv.DeviceGet(&cu.dev[i].cudev, i));
    int fd = 0;
    if (drv.DeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               cu.dev[i].cudev) != CUDA_SUCCESS)
      fd = 0;
    cu.dev[i].fd_support = fd != 0;
    int fabric = 0;
    if (drv.DeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                               cu.dev[i].cudev) != CUDA_SUCCESS)
      fabric = 0;
    atomic_store_explicit(&cu.dev[i].fabric, fabric != 0, memory_order_relaxed);
  }
  cu.ndev = n;
  return GCA_OK;
}

static gca_status_t load_driver(void) {
  GCA_CHECK(open_library());
  GCA_CHECK(resolve_all(bootstrap, GCA_ARRAY_SIZE(bootstrap)));
  char what[256];
  CUresult r = drv.Init(0);
  if (r != CUDA_SUCCESS)
    return gca__error(GCA_ERR_NO_DEVICE, "init: cuInit in %s failed: %s", cu.path,
                      describe(r, what, sizeof(what)));
  r = drv.DriverGetVersion(&cu.driver_version);
  if (r != CUDA_SUCCESS)
    return gca__error(GCA_ERR_NO_DEVICE, "init: cuDriverGetVersion in %s failed: %s", cu.path,
                      describe(r, what, sizeof(what)));
  if (cu.driver_version < MIN_DRIVER_VERSION)
    return gca__error(GCA_ERR_NO_DEVICE,
                      "init: the driver in %s supports CUDA %d.%d; gca needs %d.%d or newer",
                      cu.path, cu.driver_version / 1000, cu.driver_version % 1000 / 10,
                      MIN_DRIVER_VERSION / 1000, MIN_DRIVER_VERSION % 1000 / 10);
  GCA_CHECK(resolve_all(symbols, GCA_ARRAY_SIZE(symbols)));
  return load_devices();
}

static void run_init(void) {
  cu.status = load_driver();
  if (cu.status == GCA_OK)
    return;
  snprintf(cu.detail, sizeof(cu.detail), "%s", gca_last_error());
  free(cu.dev);
  cu.dev = NULL;
  cu.ndev = 0;
  if (cu.lib)
    dlclose(cu.lib);
  cu.lib = NULL;
  memset(&drv, 0, sizeof(drv));
}

/* GCA_OK once the driver is loaded; otherwise init's status with "<op>: " and
 * init's detail. */
static gca_status_t ready(const char *op) {
  pthread_once(&cu.once, run_init);
  if (GCA_UNLIKELY(cu.status != GCA_OK))
    return gca__error(cu.status, "%s: cuda backend unavailable: %s", op, cu.detail);
  return GCA_OK;
}

/* ---- contexts (Note [Cuda contexts]) ---- */

static gca_status_t check_dev(const char *op, int dev) {
  GCA_CHECK(ready(op));
  if (dev < 0 || dev >= cu.ndev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d is not in [0, %d)", op, dev,
                      cu.ndev);
  return GCA_OK;
}

/* The retained primary context of `dev` (validated), retaining it on first use. */
static gca_status_t primary_ctx(const char *op, int dev, CUcontext *out) {
  CUcontext ctx = atomic_load_explicit(&cu.dev[dev].ctx, memory_order_acquire);
  if (GCA_LIKELY(ctx != NULL)) {
    *out = ctx;
    return GCA_OK;
  }
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&dev_lock);
  ctx = atomic_load_explicit(&cu.dev[dev].ctx, memory_order_relaxed);
  if (!ctx) {
    CU_CHECK_GOTO(op, drv.DevicePrimaryCtxRetain(&ctx, cu.dev[dev].cudev), st, out_unlock);
    atomic_store_explicit(&cu.dev[dev].ctx, ctx, memory_order_release);
  }
  *out = ctx;
out_unlock:
  pthread_mutex_unlock(&dev_lock);
  return st;
}

static gca_status_t make_current(const char *op, CUcontext ctx) {
  CUcontext cur = NULL;
  CU_CHECK(op, drv.CtxGetCurrent(&cur));
  if (cur != ctx)
    CU_CHECK(op, drv.CtxSetCurrent(ctx));
  return GCA_OK;
}

/* Makes `dev`'s primary context current on this thread. */
static gca_status_t enter_dev(const char *op, int dev) {
  GCA_CHECK(check_dev(op, dev));
  CUcontext ctx = NULL;
  GCA_CHECK(primary_ctx(op, dev, &ctx));
  return make_current(op, ctx);
}

/* The calling thread's current device (ctx_set_device); 0 until set. */
static _Thread_local int t_current_dev;

/* Ensures some context is current: the thread's own, else its current device's. */
static gca_status_t enter_any(const char *op) {
  GCA_CHECK(ready(op));
  CUcontext cur = NULL;
  CU_CHECK(op, drv.CtxGetCurrent(&cur));
  if (cur)
    return GCA_OK;
  return enter_dev(op, t_current_dev);
}

/* Makes the context of `stream` current (for NULL and the special handles of
 * Note [Special streams], which the driver resolves in the current context:
 * the current device's primary context). When `dev` is not NULL, stores the
 * device index, or GCA_ERR_INVALID_HANDLE when the stream lives in a context
 * other than a device's primary one. */
static gca_status_t enter_stream(const char *op, gca_stream_t stream, int *dev) {
  if (stream == NULL || GCA_STREAM_IS_SPECIAL(stream)) {
    GCA_CHECK(enter_dev(op, t_current_dev));
  } else {
    GCA_CHECK(ready(op));
    CUcontext ctx = NULL;
    CU_CHECK(op, drv.StreamGetCtx(stream, &ctx));
    GCA_CHECK(make_current(op, ctx));
  }
  if (!dev)
    return GCA_OK;
  CUdevice cudev;
  CU_CHECK(op, drv.CtxGetDevice(&cudev));
  for (int i = 0; i < cu.ndev; i++) {
    if (cu.dev[i].cudev == cudev) {
      *dev = i;
      return GCA_OK;
    }
  }
  return gca__error(GCA_ERR_INVALID_HANDLE, "%s: stream %p is on an unknown device %d", op,
                    (void *)stream, (int)cudev);
}

/* ---- device queries ---- */

static gca_status_t cuda_init(void) {
  pthread_once(&cu.once, run_init);
  if (cu.status != GCA_OK)
    return gca__error(cu.status, "%s", cu.detail);
  return GCA_OK;
}

static gca_status_t cuda_device_count(int *count) {
  GCA_CHECK(ready("device_count"));
  if (!count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = cu.ndev;
  return GCA_OK;
}

static gca_status_t cuda_device_attr(int dev, gca_dev_attr_t attr, int *value) {
  GCA_CHECK(check_dev("device_attr", dev));
  CUdevice_attribute a;
  switch (attr) {
  case GCA_ATTR_CC_MAJOR:
    a = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
    break;
  case GCA_ATTR_CC_MINOR:
    a = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
    break;
  case GCA_ATTR_MULTIPROCESSOR_COUNT:
    a = CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    break;
  case GCA_ATTR_VMM_SUPPORTED:
    a = CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    break;
  case GCA_ATTR_POSIX_FD_SUPPORTED:
    a = CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    break;
  case GCA_ATTR_FABRIC_SUPPORTED:
    a = CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED;
    break;
  case GCA_ATTR_MEMORY_POOLS_SUPPORTED:
    a = CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
    break;
  case GCA_ATTR_UNIFIED_ADDRESSING:
    a = CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING;
    break;
  default:
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_attr: unknown attribute %d", (int)attr);
  }
  if (!value)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_attr: value is NULL");
  CU_CHECK("device_attr", drv.DeviceGetAttribute(value, a, cu.dev[dev].cudev));
  return GCA_OK;
}

static gca_status_t cuda_device_name(int dev, char *name, size_t len) {
  GCA_CHECK(check_dev("device_name", dev));
  if (!name || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_name: empty buffer");
  CU_CHECK("device_name",
           drv.DeviceGetName(name, len > INT32_MAX ? INT32_MAX : (int)len, cu.dev[dev].cudev));
  return GCA_OK;
}

static gca_status_t cuda_device_can_access_peer(int dev, int peer, int *can) {
  GCA_CHECK(check_dev("device_can_access_peer", dev));
  GCA_CHECK(check_dev("device_can_access_peer", peer));
  CU_CHECK("device_can_access_peer",
           drv.DeviceCanAccessPeer(can, cu.dev[dev].cudev, cu.dev[peer].cudev));
  return GCA_OK;
}

/* The driver refuses a context as its own peer with CUDA_ERROR_INVALID_CONTEXT;
 * that is a caller's mistake here, so it is caught before the call. */
static gca_status_t cuda_ctx_enable_peer_access(int dev, int peer) {
  GCA_CHECK(check_dev("ctx_enable_peer_access", peer));
  if (dev == peer)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "ctx_enable_peer_access: device %d cannot be its own peer "
                      "(CUDA_ERROR_INVALID_CONTEXT)",
                      dev);
  CUcontext peer_ctx = NULL;
  GCA_CHECK(primary_ctx("ctx_enable_peer_access", peer, &peer_ctx));
  GCA_CHECK(enter_dev("ctx_enable_peer_access", dev));
  CU_CHECK("ctx_enable_peer_access", drv.CtxEnablePeerAccess(peer_ctx, 0));
  return GCA_OK;
}

static gca_status_t cuda_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
  GCA_CHECK(enter_dev("mem_get_info", dev));
  CU_CHECK("mem_get_info", drv.MemGetInfo(free_bytes, total_bytes));
  return GCA_OK;
}

/* ---- classic memory ---- */

static gca_status_t cuda_mem_alloc(int dev, size_t size, gca_devptr_t *out) {
  GCA_CHECK(enter_dev("mem_alloc", dev));
  CUdeviceptr p = 0;
  CU_CHECK("mem_alloc", drv.MemAlloc(&p, size));
  *out = (gca_devptr_t)p;
  return GCA_OK;
}

static gca_status_t cuda_mem_free(int dev, gca_devptr_t ptr) {
  GCA_CHECK(enter_dev("mem_free", dev));
  CU_CHECK("mem_free", drv.MemFree((CUdeviceptr)ptr));
  return GCA_OK;
}

/* ---- virtual memory management ---- */

/* Note [Fabric handles]: a device that reports HANDLE_TYPE_FABRIC_SUPPORTED
 * gets its memory created with POSIX_FD | FABRIC requested, so every handle can
 * later be exported either way. The attribute says what the hardware can do,
 * not whether this process may: without an IMEX channel cuMemCreate refuses
 * the fabric request (CUDA_ERROR_NOT_PERMITTED, or NOT_SUPPORTED). Then the
 * create is retried without it and the device stops asking, so memory stays
 * fd-exportable and a later mem_export_fabric fails in the driver. */

/* Pinned device memory on `dev`, exportable as a POSIX fd where supported and
 * as a fabric handle while `fabric` is set. */
static CUmemAllocationProp alloc_prop(int dev, bool fabric) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  unsigned types =
      cu.dev[dev].fd_support ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  if (fabric)
    types |= CU_MEM_HANDLE_TYPE_FABRIC;
  prop.requestedHandleTypes = (CUmemAllocationHandleType)types;
  return prop;
}

static bool wants_fabric(int dev) {
  return atomic_load_explicit(&cu.dev[dev].fabric, memory_order_relaxed) != 0;
}

static gca_status_t cuda_mem_granularity(int dev, bool recommended, size_t *granularity) {
  GCA_CHECK(check_dev("mem_granularity", dev));
  CUmemAllocationProp prop = alloc_prop(dev, wants_fabric(dev));
  CU_CHECK("mem_granularity",
           drv.MemGetAllocationGranularity(granularity, &prop,
                                           recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                                                       : CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return GCA_OK;
}

static gca_status_t cuda_mem_address_reserve(int dev, size_t size, size_t alignment,
                                             gca_devptr_t *out) {
  GCA_CHECK(check_dev("mem_address_reserve", dev));
  CUdeviceptr p = 0;
  CU_CHECK("mem_address_reserve", drv.MemAddressReserve(&p, size, alignment, 0, 0));
  *out = (gca_devptr_t)p;
  return GCA_OK;
}

static gca_status_t cuda_mem_address_free(int dev, gca_devptr_t ptr, size_t size) {
  GCA_CHECK(check_dev("mem_address_free", dev));
  CU_CHECK("mem_address_free", drv.MemAddressFree((CUdeviceptr)ptr, size));
  return GCA_OK;
}

static gca_status_t cuda_mem_create(int dev, size_t size, gca_memhandle_t *out) {
  GCA_CHECK(check_dev("mem_create", dev));
  bool fabric = wants_fabric(dev);
  CUmemAllocationProp prop = alloc_prop(dev, fabric);
  CUmemGenericAllocationHandle h = 0;
  CUresult r = drv.MemCreate(&h, size, &prop, 0);
  if (fabric && (r == CUDA_ERROR_NOT_PERMITTED || r == CUDA_ERROR_NOT_SUPPORTED)) {
    char what[256];
    GCA_LOG_INFO("mem_create: device %d refused fabric handles (%s); creating memory without "
                 "them from now on (Note [Fabric handles])",
                 dev, describe(r, what, sizeof(what)));
    atomic_store_explicit(&cu.dev[dev].fabric, 0, memory_order_relaxed);
    prop = alloc_prop(dev, false);
    r = drv.MemCreate(&h, size, &prop, 0);
  }
  CU_CHECK("mem_create", r);
  *out = (gca_memhandle_t)h;
  return GCA_OK;
}

static gca_status_t cuda_mem_release(gca_memhandle_t handle) {
  GCA_CHECK(ready("mem_release"));
  CU_CHECK("mem_release", drv.MemRelease((CUmemGenericAllocationHandle)handle));
  return GCA_OK;
}

static gca_status_t cuda_mem_map(gca_devptr_t ptr, size_t size, size_t offset,
                                 gca_memhandle_t handle) {
  GCA_CHECK(ready("mem_map"));
  CU_CHECK("mem_map",
           drv.MemMap((CUdeviceptr)ptr, size, offset, (CUmemGenericAllocationHandle)handle, 0));
  return GCA_OK;
}

static gca_status_t cuda_mem_unmap(gca_devptr_t ptr, size_t size) {
  GCA_CHECK(ready("mem_unmap"));
  CU_CHECK("mem_unmap", drv.MemUnmap((CUdeviceptr)ptr, size));
  return GCA_OK;
}

static gca_status_t cuda_mem_set_access(gca_devptr_t ptr, size_t size, const int *devs, int ndevs) {
  GCA_CHECK(ready("mem_set_access"));
  if (!devs || ndevs <= 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_set_access: no devices given for 0x%llx",
                      (unsigned long long)ptr);
  for (int i = 0; i < ndevs; i++)
    GCA_CHECK(check_dev("mem_set_access", devs[i]));
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
  CU_CHECK_GOTO("mem_set_access", drv.MemSetAccess((CUdeviceptr)ptr, size, desc, (size_t)ndevs), st,
                out_free);
out_free:
  free(desc);
  return st;
}

static gca_status_t cuda_mem_export_fd(gca_memhandle_t handle, int *fd) {
  GCA_CHECK(ready("mem_export_fd"));
  if (!drv.MemExportToShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fd: the driver lacks cuMemExportToShareableHandle");
  int out = -1;
  CU_CHECK("mem_export_fd",
           drv.MemExportToShareableHandle(&out, (CUmemGenericAllocationHandle)handle,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  *fd = out;
  return GCA_OK;
}

static gca_status_t cuda_mem_import_fd(int dev, int fd, gca_memhandle_t *out) {
  GCA_CHECK(check_dev("mem_import_fd", dev));
  if (!drv.MemImportFromShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_import_fd: the driver lacks cuMemImportFromShareableHandle");
  CUmemGenericAllocationHandle h = 0;
  CU_CHECK("mem_import_fd",
           drv.MemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  *out = (gca_memhandle_t)h;
  return GCA_OK;
}

static gca_status_t cuda_mem_export_fabric(gca_memhandle_t handle,
                                           uint8_t out[GCA_FABRIC_HANDLE_LEN]) {
  GCA_CHECK(ready("mem_export_fabric"));
  if (!drv.MemExportToShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fabric: the driver lacks cuMemExportToShareableHandle");
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_export_fabric: out is NULL");
  CUmemFabricHandle fh;
  _Static_assert(sizeof(fh.data) == GCA_FABRIC_HANDLE_LEN, "CUmemFabricHandle size");
  memset(&fh, 0, sizeof(fh));
  CU_CHECK("mem_export_fabric",
           drv.MemExportToShareableHandle(&fh, (CUmemGenericAllocationHandle)handle,
                                          CU_MEM_HANDLE_TYPE_FABRIC, 0));
  memcpy(out, fh.data, GCA_FABRIC_HANDLE_LEN);
  return GCA_OK;
}

static gca_status_t cuda_mem_import_fabric(int dev, const uint8_t in[GCA_FABRIC_HANDLE_LEN],
                                           gca_memhandle_t *out) {
  GCA_CHECK(check_dev("mem_import_fabric", dev));
  if (!drv.MemImportFromShareableHandle)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_import_fabric: the driver lacks cuMemImportFromShareableHandle");
  if (!in || !out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_import_fabric: %s is NULL", in ? "out" : "in");
  CUmemFabricHandle fh;
  memcpy(fh.data, in, GCA_FABRIC_HANDLE_LEN);
  CUmemGenericAllocationHandle h = 0;
  CU_CHECK("mem_import_fabric",
           drv.MemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC));
  *out = (gca_memhandle_t)h;
  return GCA_OK;
}

static gca_status_t cuda_ctx_set_device(int dev) {
  GCA_CHECK(enter_dev("ctx_set_device", dev));
  t_current_dev = dev;
  return GCA_OK;
}

static gca_status_t cuda_ctx_get_device(int *dev) {
  GCA_CHECK(ready("ctx_get_device"));
  if (!dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ctx_get_device: dev is NULL");
  *dev = t_current_dev;
  return GCA_OK;
}

static gca_status_t cuda_stream_get_device(gca_stream_t stream, int *dev) {
  if (!dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_get_device: dev is NULL");
  if (stream == NULL || GCA_STREAM_IS_SPECIAL(stream)) {
    GCA_CHECK(ready("stream_get_device"));
    *dev = t_current_dev;
    return GCA_OK;
  }
  return enter_stream("stream_get_device", stream, dev);
}

static gca_status_t cuda_ctx_synchronize(int dev) {
  GCA_CHECK(enter_dev("ctx_synchronize", dev));
  CU_CHECK("ctx_synchronize", drv.CtxSynchronize());
  return GCA_OK;
}

/* ---- streams and events ---- */

static gca_status_t cuda_stream_create(int dev, unsigned flags, int priority, gca_stream_t *out) {
  GCA_CHECK(enter_dev("stream_create", dev));
  CUstream s = NULL;
  CU_CHECK("stream_create", drv.StreamCreateWithPriority(&s, flags, priority));
  *out = s;
  return GCA_OK;
}

static gca_status_t cuda_stream_destroy(gca_stream_t stream) {
  GCA_CHECK(ready("stream_destroy"));
  if (!stream || GCA_STREAM_IS_SPECIAL(stream))
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "stream_destroy: the %s default stream (%p) cannot be destroyed",
                      stream == GCA_STREAM_PER_THREAD ? "per-thread" : "legacy", (void *)stream);
  GCA_CHECK(enter_stream("stream_destroy", stream, NULL));
  CU_CHECK("stream_destroy", drv.StreamDestroy(stream));
  return GCA_OK;
}

static gca_status_t cuda_stream_synchronize(gca_stream_t stream) {
  GCA_CHECK(enter_stream("stream_synchronize", stream, NULL));
  CU_CHECK("stream_synchronize", drv.StreamSynchronize(stream));
  return GCA_OK;
}

static gca_status_t cuda_stream_query(gca_stream_t stream) {
  GCA_CHECK(enter_stream("stream_query", stream, NULL));
  CU_CHECK("stream_query", drv.StreamQuery(stream));
  return GCA_OK;
}

static gca_status_t cuda_stream_wait_event(gca_stream_t stream, gca_event_t event) {
  GCA_CHECK(enter_stream("stream_wait_event", stream, NULL));
  CU_CHECK("stream_wait_event", drv.StreamWaitEvent(stream, event, 0));
  return GCA_OK;
}

static gca_status_t cuda_event_create(int dev, unsigned flags, gca_event_t *out) {
  GCA_CHECK(enter_dev("event_create", dev));
  CUevent e = NULL;
  CU_CHECK("event_create", drv.EventCreate(&e, flags));
  *out = e;
  return GCA_OK;
}

static gca_status_t cuda_event_destroy(gca_event_t event) {
  GCA_CHECK(enter_any("event_destroy"));
  CU_CHECK("event_destroy", drv.EventDestroy(event));
  return GCA_OK;
}

static gca_status_t cuda_event_record(gca_event_t event, gca_stream_t stream) {
  GCA_CHECK(enter_stream("event_record", stream, NULL));
  CU_CHECK("event_record", drv.EventRecord(event, stream));
  return GCA_OK;
}

static gca_status_t cuda_event_query(gca_event_t event) {
  GCA_CHECK(enter_any("event_query"));
  CU_CHECK("event_query", drv.EventQuery(event));
  return GCA_OK;
}

static gca_status_t cuda_event_synchronize(gca_event_t event) {
  GCA_CHECK(enter_any("event_synchronize"));
  CU_CHECK("event_synchronize", drv.EventSynchronize(event));
  return GCA_OK;
}

static gca_status_t cuda_event_elapsed(gca_event_t start, gca_event_t end, float *ms) {
  GCA_CHECK(enter_any("event_elapsed"));
  if (drv.EventElapsedTime_v2)
    CU_CHECK("event_elapsed", drv.EventElapsedTime_v2(ms, start, end));
  else
    CU_CHECK("event_elapsed", drv.EventElapsedTime_v1(ms, start, end));
  return GCA_OK;
}

/* ---- stream work ---- */

static gca_status_t cuda_launch_host_func(gca_stream_t stream, gca_host_fn_t fn, void *user_data) {
  GCA_CHECK(enter_stream("launch_host_func", stream, NULL));
  CU_CHECK("launch_host_func", drv.LaunchHostFunc(stream, fn, user_data));
  return GCA_OK;
}

static gca_status_t cuda_memcpy_async(gca_devptr_t dst, gca_devptr_t src, size_t bytes,
                                      gca_stream_t stream) {
  GCA_CHECK(enter_stream("memcpy_async", stream, NULL));
  CU_CHECK("memcpy_async", drv.MemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, bytes, stream));
  return GCA_OK;
}

static gca_status_t cuda_memset_d8_async(gca_devptr_t dst, uint8_t value, size_t count,
                                         gca_stream_t stream) {
  GCA_CHECK(enter_stream("memset_d8_async", stream, NULL));
  CU_CHECK("memset_d8_async", drv.MemsetD8Async((CUdeviceptr)dst, value, count, stream));
  return GCA_OK;
}

static gca_status_t cuda_memset_d32_async(gca_devptr_t dst, uint32_t value, size_t count,
                                          gca_stream_t stream) {
  GCA_CHECK(enter_stream("memset_d32_async", stream, NULL));
  CU_CHECK("memset_d32_async", drv.MemsetD32Async((CUdeviceptr)dst, value, count, stream));
  return GCA_OK;
}

/* ---- kernels ---- */

/* Loads the PTX module into `dev`'s primary context (current on this thread)
 * once. The thread's capture mode is relaxed meanwhile: loading a module is
 * not legal under a global-mode capture, and the first launch may be captured. */
static gca_status_t load_module(const char *op, int dev, cuda_device_t **out) {
  cuda_device_t *d = &cu.dev[dev];
  *out = d;
  if (GCA_LIKELY(atomic_load_explicit(&d->module, memory_order_acquire) != NULL))
    return GCA_OK;
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&dev_lock);
  if (atomic_load_explicit(&d->module, memory_order_relaxed) != NULL)
    goto out_unlock;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_CHECK_GOTO(op, drv.ThreadExchangeStreamCaptureMode(&mode), st, out_unlock);
  CUmodule mod = NULL;
  CU_CHECK_GOTO(op, drv.ModuleLoadData(&mod, gca__cuda_ptx), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_fill, mod, GCA_PTX_FILL_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_add, mod, GCA_PTX_ADD_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_sleep, mod, GCA_PTX_SLEEP_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_philox, mod, GCA_PTX_PHILOX_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_copy, mod, GCA_PTX_COPY_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_gemm, mod, GCA_PTX_GEMM_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_ew, mod, GCA_PTX_EW_NAME), st, out_mode);
  CU_CHECK_GOTO(op, drv.ModuleGetFunction(&d->fn_dot, mod, GCA_PTX_DOT_NAME), st, out_mode);
  atomic_store_explicit(&d->module, mod, memory_order_release);
out_mode:
  /* A module that failed half-way is leaked on purpose: unloading is another
   * unsafe call under capture, and this path means the JIT is broken anyway. */
  drv.ThreadExchangeStreamCaptureMode(&mode);
out_unlock:
  pthread_mutex_unlock(&dev_lock);
  return st;
}

static unsigned grid_for(size_t count) {
  size_t blocks = (count + KERNEL_BLOCK - 1) / KERNEL_BLOCK;
  return blocks > KERNEL_MAX_GRID ? KERNEL_MAX_GRID : (unsigned)(blocks ? blocks : 1);
}

static gca_status_t cuda_kernel_fill_u32(gca_devptr_t dst, uint32_t value, uint32_t step,
                                         size_t count, gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  GCA_CHECK(enter_stream("kernel_fill_u32", stream, &dev));
  GCA_CHECK(load_module("kernel_fill_u32", dev, &d));
  if (count == 0)
    return GCA_OK;
  CUdeviceptr p_dst = (CUdeviceptr)dst;
  uint64_t p_count = count;
  void *args[] = {&p_dst, &value, &step, &p_count};
  CU_CHECK("kernel_fill_u32", drv.LaunchKernel(d->fn_fill, grid_for(count), 1, 1, KERNEL_BLOCK, 1,
                                               1, 0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_add_u32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                        size_t count, gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  GCA_CHECK(enter_stream("kernel_add_u32", stream, &dev));
  GCA_CHECK(load_module("kernel_add_u32", dev, &d));
  if (count == 0)
    return GCA_OK;
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_a = (CUdeviceptr)a, p_b = (CUdeviceptr)b;
  uint64_t p_count = count;
  void *args[] = {&p_dst, &p_a, &p_b, &p_count};
  CU_CHECK("kernel_add_u32", drv.LaunchKernel(d->fn_add, grid_for(count), 1, 1, KERNEL_BLOCK, 1, 1,
                                              0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_sleep(uint64_t ns, gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  GCA_CHECK(enter_stream("kernel_sleep", stream, &dev));
  GCA_CHECK(load_module("kernel_sleep", dev, &d));
  void *args[] = {&ns};
  CU_CHECK("kernel_sleep", drv.LaunchKernel(d->fn_sleep, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

/* The batch's entries over the grid's y (at most 65535 blocks there: the
 * kernel strides), 32 blocks of KERNEL_BLOCK threads over each entry's bytes. */
static gca_status_t cuda_kernel_copy_batch(gca_devptr_t table, size_t n, gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  GCA_CHECK(enter_stream("kernel_copy_batch", stream, &dev));
  if (n > 0 && (!table || (table & 7u)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "kernel_copy_batch: table 0x%llx must be an 8-byte aligned device pointer "
                      "(%zu entries)",
                      (unsigned long long)table, n);
  GCA_CHECK(load_module("kernel_copy_batch", dev, &d));
  if (n == 0)
    return GCA_OK;
  CUdeviceptr p_table = (CUdeviceptr)table;
  uint64_t p_n = n;
  void *args[] = {&p_table, &p_n};
  unsigned gy = n > 65535 ? 65535u : (unsigned)n;
  CU_CHECK("kernel_copy_batch",
           drv.LaunchKernel(d->fn_copy, 32, gy, 1, KERNEL_BLOCK, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_philox_u32(gca_devptr_t dst, size_t count, gca_devptr_t seed_ptr,
                                           gca_devptr_t offset_ptr, uint64_t offset_add,
                                           gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  GCA_CHECK(enter_stream("kernel_philox_u32", stream, &dev));
  GCA_CHECK(load_module("kernel_philox_u32", dev, &d));
  if (count == 0)
    return GCA_OK;
  if (!dst || (dst & 3u) || !seed_ptr || (seed_ptr & 7u) || !offset_ptr || (offset_ptr & 7u))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "kernel_philox_u32: dst 0x%llx must be a 4-byte aligned, seed 0x%llx and "
                      "offset 0x%llx 8-byte aligned device pointers",
                      (unsigned long long)dst, (unsigned long long)seed_ptr,
                      (unsigned long long)offset_ptr);
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_seed = (CUdeviceptr)seed_ptr,
              p_off = (CUdeviceptr)offset_ptr;
  uint64_t p_count = count, p_add = offset_add;
  void *args[] = {&p_dst, &p_count, &p_seed, &p_off, &p_add};
  CU_CHECK("kernel_philox_u32", drv.LaunchKernel(d->fn_philox, grid_for((count + 3) / 4), 1, 1,
                                                 KERNEL_BLOCK, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

/* ---- compute kernels (Note [Compute order], device.h) ---- */

/* One thread per element of C, GEMM_TILE x GEMM_TILE threads a block, blocks
 * over C's columns (x) and rows (y), at most KERNEL_MAX_GRID each way (the
 * kernel strides). Nothing is launched when C's span is empty. */
static unsigned gemm_grid(uint32_t extent) {
  uint32_t blocks = extent / GEMM_TILE + (extent % GEMM_TILE != 0);
  return blocks > KERNEL_MAX_GRID ? KERNEL_MAX_GRID : blocks;
}

static gca_status_t cuda_kernel_gemm_f32(gca_devptr_t c, gca_devptr_t a, gca_devptr_t b, uint32_t m,
                                         uint32_t n, uint32_t k, uint32_t flags,
                                         gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  gca__compute_span_t span;
  GCA_CHECK(enter_stream("kernel_gemm_f32", stream, &dev));
  GCA_CHECK(gca__check_gemm_f32(c, a, b, m, n, k, flags, &span));
  GCA_CHECK(load_module("kernel_gemm_f32", dev, &d));
  if (span.dst == 0)
    return GCA_OK;
  CUdeviceptr p_c = (CUdeviceptr)c, p_a = (CUdeviceptr)a, p_b = (CUdeviceptr)b;
  void *args[] = {&p_c, &p_a, &p_b, &m, &n, &k, &flags};
  CU_CHECK("kernel_gemm_f32", drv.LaunchKernel(d->fn_gemm, gemm_grid(n), gemm_grid(m), 1, GEMM_TILE,
                                               GEMM_TILE, 1, 0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_ew_f32(gca_ew_op_t op, gca_devptr_t dst, gca_devptr_t a,
                                       gca_devptr_t b, float s, uint32_t u, size_t count,
                                       gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  gca__compute_span_t span;
  GCA_CHECK(enter_stream("kernel_ew_f32", stream, &dev));
  GCA_CHECK(gca__check_ew_f32(op, dst, a, b, count, &span));
  GCA_CHECK(load_module("kernel_ew_f32", dev, &d));
  if (count == 0)
    return GCA_OK;
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_a = (CUdeviceptr)a, p_b = span.b ? (CUdeviceptr)b : 0;
  uint64_t p_count = count;
  uint32_t p_op = (uint32_t)op;
  void *args[] = {&p_dst, &p_a, &p_b, &p_count, &p_op, &s, &u};
  CU_CHECK("kernel_ew_f32", drv.LaunchKernel(d->fn_ew, grid_for(count), 1, 1, KERNEL_BLOCK, 1, 1, 0,
                                             stream, args, NULL));
  return GCA_OK;
}

/* One block of GCA__DOT_LANES threads, whatever count is: the lanes fix the
 * order of the sum. */
static gca_status_t cuda_kernel_dot_f32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                        size_t count, float s, gca_stream_t stream) {
  int dev;
  cuda_device_t *d;
  gca__compute_span_t span;
  GCA_CHECK(enter_stream("kernel_dot_f32", stream, &dev));
  GCA_CHECK(gca__check_dot_f32(dst, a, b, count, &span));
  GCA_CHECK(load_module("kernel_dot_f32", dev, &d));
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_a = (CUdeviceptr)a, p_b = (CUdeviceptr)b;
  uint64_t p_count = count;
  void *args[] = {&p_dst, &p_a, &p_b, &p_count, &s};
  CU_CHECK("kernel_dot_f32",
           drv.LaunchKernel(d->fn_dot, 1, 1, 1, GCA__DOT_LANES, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

/* ---- capture ---- */

static gca_status_t cuda_stream_begin_capture(gca_stream_t stream, gca_capture_mode_t mode) {
  GCA_CHECK(enter_stream("stream_begin_capture", stream, NULL));
  CU_CHECK("stream_begin_capture", drv.StreamBeginCapture(stream, (CUstreamCaptureMode)mode));
  return GCA_OK;
}

static gca_status_t cuda_stream_end_capture(gca_stream_t stream, gca_graph_t *graph) {
  GCA_CHECK(enter_stream("stream_end_capture", stream, NULL));
  CUgraph g = NULL;
  CU_CHECK("stream_end_capture", drv.StreamEndCapture(stream, &g));
  *graph = g;
  return GCA_OK;
}

static gca_status_t cuda_stream_capture_info(gca_stream_t stream, gca_capture_status_t *status,
                                             uint64_t *id) {
  GCA_CHECK(enter_stream("stream_capture_info", stream, NULL));
  if (!status)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_capture_info: status is NULL");
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  if (drv.StreamGetCaptureInfo_v3)
    CU_CHECK("stream_capture_info",
             drv.StreamGetCaptureInfo_v3(stream, &cs, &cid, NULL, NULL, NULL, NULL));
  else
    CU_CHECK("stream_capture_info",
             drv.StreamGetCaptureInfo_v2(stream, &cs, &cid, NULL, NULL, NULL));
  *status = (gca_capture_status_t)cs;
  if (id)
    *id = cid;
  return GCA_OK;
}

static gca_status_t cuda_thread_exchange_capture_mode(gca_capture_mode_t *mode) {
  GCA_CHECK(ready("thread_exchange_capture_mode"));
  if (!mode)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "thread_exchange_capture_mode: mode is NULL");
  CUstreamCaptureMode m = (CUstreamCaptureMode)*mode;
  CU_CHECK("thread_exchange_capture_mode", drv.ThreadExchangeStreamCaptureMode(&m));
  *mode = (gca_capture_mode_t)m;
  return GCA_OK;
}

/* ---- graphs ---- */

static gca_status_t cuda_graph_node_count(gca_graph_t graph, size_t *count) {
  GCA_CHECK(enter_any("graph_node_count"));
  size_t n = 0;
  CU_CHECK("graph_node_count", drv.GraphGetNodes(graph, NULL, &n));
  *count = n;
  return GCA_OK;
}

static gca_status_t cuda_graph_instantiate(gca_graph_t graph, gca_graph_exec_t *out) {
  GCA_CHECK(enter_any("graph_instantiate"));
  CUgraphExec e = NULL;
  CU_CHECK("graph_instantiate", drv.GraphInstantiateWithFlags(&e, graph, 0));
  *out = e;
  return GCA_OK;
}

static gca_status_t cuda_graph_upload(gca_graph_exec_t exec, gca_stream_t stream) {
  GCA_CHECK(enter_stream("graph_upload", stream, NULL));
  if (!drv.GraphUpload)
    return gca__error(GCA_ERR_NOT_SUPPORTED, "graph_upload: the driver lacks cuGraphUpload");
  CU_CHECK("graph_upload", drv.GraphUpload(exec, stream));
  return GCA_OK;
}

static gca_status_t cuda_graph_launch(gca_graph_exec_t exec, gca_stream_t stream) {
  GCA_CHECK(enter_stream("graph_launch", stream, NULL));
  CU_CHECK("graph_launch", drv.GraphLaunch(exec, stream));
  return GCA_OK;
}

static const char *update_result_text(CUgraphExecUpdateResult r) {
  switch (r) {
  case CU_GRAPH_EXEC_UPDATE_SUCCESS:
    return "success";
  case CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED:
    return "topology changed";
  case CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED:
    return "node type changed";
  case CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED:
    return "kernel function changed";
  case CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE:
    return "kernel function changed in an unsupported way";
  case CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED:
    return "parameters changed in an unsupported way";
  case CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED:
    return "node not supported by update";
  case CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED:
    return "node attributes changed";
  default:
    return "update failed";
  }
}

static gca_graph_update_result_t update_result(CUgraphExecUpdateResult r) {
  switch (r) {
  case CU_GRAPH_EXEC_UPDATE_SUCCESS:
    return GCA_GRAPH_UPDATE_SUCCESS;
  case CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED:
    return GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED:
    return GCA_GRAPH_UPDATE_NODE_TYPE_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED:
    return GCA_GRAPH_UPDATE_FUNCTION_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE:
    return GCA_GRAPH_UPDATE_UNSUPPORTED_FUNCTION_CHANGE;
  case CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED:
    return GCA_GRAPH_UPDATE_PARAMETERS_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED:
    return GCA_GRAPH_UPDATE_ATTRIBUTES_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED:
    return GCA_GRAPH_UPDATE_NOT_SUPPORTED;
  default:
    return GCA_GRAPH_UPDATE_ERROR;
  }
}

/* Position of `node` in cuGraphGetNodes' order of `graph`, or SIZE_MAX. */
static size_t node_index(CUgraph graph, CUgraphNode node) {
  size_t n = 0, idx = SIZE_MAX;
  if (!node || drv.GraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS || n == 0)
    return SIZE_MAX;
  CUgraphNode *nodes = calloc(n, sizeof(*nodes));
  if (!nodes)
    return SIZE_MAX;
  if (drv.GraphGetNodes(graph, nodes, &n) == CUDA_SUCCESS) {
    for (size_t i = 0; i < n; i++) {
      if (nodes[i] == node) {
        idx = i;
        break;
      }
    }
  }
  free(nodes);
  return idx;
}

static gca_status_t cuda_graph_exec_update(gca_graph_exec_t exec, gca_graph_t graph,
                                           gca_graph_update_info_t *info) {
  GCA_CHECK(enter_any("graph_exec_update"));
  CUgraphExecUpdateResultInfo ri;
  memset(&ri, 0, sizeof(ri));
  CUresult r = drv.GraphExecUpdate(exec, graph, &ri);
  size_t idx = SIZE_MAX;
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
    idx = node_index(graph, ri.errorNode);
  if (info) {
    info->result = r == CUDA_SUCCESS ? GCA_GRAPH_UPDATE_SUCCESS : update_result(ri.result);
    info->error_node_index = idx;
    if (r == CUDA_SUCCESS)
      info->reason[0] = '\0';
    else if (idx != SIZE_MAX)
      snprintf(info->reason, sizeof(info->reason), "node %zu: %s", idx,
               update_result_text(ri.result));
    else
      snprintf(info->reason, sizeof(info->reason), "%s", update_result_text(ri.result));
  }
  if (r == CUDA_SUCCESS)
    return GCA_OK;
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
    if (idx != SIZE_MAX)
      return gca__error(GCA_ERR_GRAPH_UPDATE, "graph_exec_update: rejected at node %zu: %s", idx,
                        update_result_text(ri.result));
    return gca__error(GCA_ERR_GRAPH_UPDATE, "graph_exec_update: rejected: %s",
                      update_result_text(ri.result));
  }
  return cu_error("graph_exec_update", r);
}

static gca_status_t cuda_graph_destroy(gca_graph_t graph) {
  GCA_CHECK(enter_any("graph_destroy"));
  CU_CHECK("graph_destroy", drv.GraphDestroy(graph));
  return GCA_OK;
}

static gca_status_t cuda_graph_exec_destroy(gca_graph_exec_t exec) {
  GCA_CHECK(enter_any("graph_exec_destroy"));
  CU_CHECK("graph_exec_destroy", drv.GraphExecDestroy(exec));
  return GCA_OK;
}

/* ---- pinned host memory ---- */

/* GCA_ERR_NOT_SUPPORTED naming op when the driver lacks the entry point. */
static gca_status_t host_entry(const char *op, const void *fn, const char *name) {
  GCA_CHECK(enter_any(op));
  if (!fn)
    return gca__error(GCA_ERR_NOT_SUPPORTED, "%s: the driver has no %s", op, name);
  return GCA_OK;
}

static gca_status_t cuda_host_alloc(size_t size, void **out) {
  GCA_CHECK(host_entry("host_alloc", (const void *)drv.MemHostAlloc, "cuMemHostAlloc"));
  void *p = NULL;
  CU_CHECK("host_alloc", drv.MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE));
  *out = p;
  return GCA_OK;
}

static gca_status_t cuda_host_free(void *ptr) {
  GCA_CHECK(host_entry("host_free", (const void *)drv.MemFreeHost, "cuMemFreeHost"));
  CU_CHECK("host_free", drv.MemFreeHost(ptr));
  return GCA_OK;
}

static gca_status_t cuda_host_register(void *ptr, size_t size) {
  GCA_CHECK(host_entry("host_register", (const void *)drv.MemHostRegister, "cuMemHostRegister"));
  CU_CHECK("host_register", drv.MemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE));
  return GCA_OK;
}

static gca_status_t cuda_host_unregister(void *ptr) {
  GCA_CHECK(
      host_entry("host_unregister", (const void *)drv.MemHostUnregister, "cuMemHostUnregister"));
  CU_CHECK("host_unregister", drv.MemHostUnregister(ptr));
  return GCA_OK;
}

static const gca_device_ops_t cuda_ops = {.name = "cuda",
#define SLOT(name) .name = cuda_##name,
                                          GCA_DEVICE_OP_MAP(SLOT)
#undef SLOT
};

const gca_device_ops_t *gca__cuda_ops(void) {
  return &cuda_ops;
}

#endif /* GCA_CUDA_FULL */
