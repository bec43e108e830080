/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_internal.h - what the cuda backend's files share: the driver's entry
 * points as resolved at load time, the loaded library's state and devices,
 * driver results turned into statuses, and entering the right context.
 *
 * Module map:
 *   cuda.c         loading the driver (dlopen, cuGetProcAddress at explicit
 *                  ABI versions) into the table of entry points, driver
 *                  results as statuses, the op table (and, built without a
 *                  usable cuda.h, the stubs that say so)
 *   cuda_device.c  devices and contexts (Note [Cuda contexts]): the device
 *                  queries, the thread's current device, peer access
 *   cuda_mem.c     memory: classic allocations, virtual memory management,
 *                  sharing by fd and fabric handle (Note [Fabric handles]),
 *                  pinned host memory
 *   cuda_stream.c  streams, events and the work queued on a stream (host
 *                  functions, copies, memsets)
 *   cuda_graph.c   stream capture and graphs
 *   cuda_kernels.c launches of the embedded PTX's kernels (cuda_ptx.h)
 *
 * Everything below needs cuda.h for CUDA 12.0 or newer (GCA_CUDA_FULL);
 * without it only cuda.c has content.
 */
#ifndef GCA_CUDA_INTERNAL_H
#define GCA_CUDA_INTERNAL_H

#include "device.h"

#if defined(GCA_HAVE_CUDA_H) && GCA_HAVE_CUDA_H
#include <cuda.h>
#if CUDA_VERSION >= 12000
#define GCA_CUDA_FULL 1
#endif
#endif

#ifdef GCA_CUDA_FULL

#include <pthread.h>

/* ---- cuda.c ---- */

typedef CUresult (*gca__cuda_getproc_v2_fn)(const char *symbol, void **pfn, int version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *found);
typedef CUresult (*gca__cuda_getproc_v1_fn)(const char *symbol, void **pfn, int version,
                                            cuuint64_t flags);

/* Every pointer has the signature of the ABI version it is resolved at (see
 * `symbols` in cuda.c); suffixes _v<n> name alternatives of one entry point. */
struct gca__cuda_driver {
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
  CUresult (*MemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *prop,
                                                   CUmemGenericAllocationHandle handle);
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
};
extern struct gca__cuda_driver gca__cuda_drv;

/* Per device, filled lazily under gca__cuda_dev_lock; once set, ctx, fd_support and
 * module/fns never change (read without the lock after an acquire load).
 * fabric starts at GCA__FABRIC_UNSETTLED when the attribute says yes (else 0)
 * and is settled once, to 1 or 0; it may still go from 1 to 0, never back
 * (Note [Fabric handles]). fabric_refusal is stored before fabric becomes 0. */
#define GCA__FABRIC_UNSETTLED (-1)
typedef struct gca__cuda_device {
  CUdevice cudev;
  CUcontext _Atomic ctx;      /* retained primary context, NULL until first use */
  int fd_support;             /* POSIX fd handles: 1 yes, 0 no (read at init) */
  int _Atomic fabric;         /* fabric handles: 1 made, 0 not, or GCA__FABRIC_UNSETTLED */
  int _Atomic fabric_refusal; /* the CUresult cuMemCreate refused them with; 0 when none */
  CUmodule _Atomic module;
  CUfunction fn_fill, fn_add, fn_sleep, fn_philox, fn_copy; /* valid once module != NULL */
  CUfunction fn_gemm, fn_ew, fn_dot;
} gca__cuda_device_t;

/* The loaded library: init's outcome, where the driver came from, its
 * devices. */
typedef struct gca__cuda_lib {
  pthread_once_t once;
  gca_status_t status;
  char detail[512];
  char path[256];
  void *lib;
  gca__cuda_getproc_v2_fn getproc_v2;
  gca__cuda_getproc_v1_fn getproc_v1;
  int driver_version;
  int ndev;
  gca__cuda_device_t *dev; /* [ndev] */
} gca__cuda_lib_t;
extern gca__cuda_lib_t gca__cuda_lib;
extern pthread_mutex_t gca__cuda_dev_lock;

/* GCA_OK once the driver is loaded; otherwise init's status with "<op>: " and
 * init's detail. */
gca_status_t gca__cuda_ready(const char *op);
/* Writes "NAME (description)" for `r` into buf, asking the driver when it can. */
const char *gca__cuda_describe(CUresult r, char *buf, size_t len);
/* Sets the detail "<op>: NAME (description)" and returns the mapped status. */
gca_status_t gca__cuda_error(const char *op, CUresult r);

/* Check-and-propagate for driver calls (NCCL's CUCHECK). */
#define CU_CHECK(op, call)                                 \
  do {                                                     \
    CUresult cu_r_ = (call);                               \
    if (GCA_UNLIKELY(cu_r_ != CUDA_SUCCESS)) {             \
      gca_status_t cu_st_ = gca__cuda_error((op), cu_r_);  \
      gca__error_trace(__FILE__, __LINE__, #call, cu_st_); \
      return cu_st_;                                       \
    }                                                      \
  } while (0)

#define CU_CHECK_GOTO(op, call, st, label)               \
  do {                                                   \
    CUresult cu_r_ = (call);                             \
    if (GCA_UNLIKELY(cu_r_ != CUDA_SUCCESS)) {           \
      (st) = gca__cuda_error((op), cu_r_);               \
      gca__error_trace(__FILE__, __LINE__, #call, (st)); \
      goto label;                                        \
    }                                                    \
  } while (0)

/* ---- cuda_device.c (Note [Cuda contexts]) ---- */

/* init's failure as gca__cuda_ready gives it, or GCA_ERR_INVALID_ARGUMENT
 * naming op unless 0 <= dev < ndev. */
gca_status_t gca__cuda_check_dev(const char *op, int dev);
/* The retained primary context of `dev` (validated), retaining it on first use. */
gca_status_t gca__cuda_primary_ctx(const char *op, int dev, CUcontext *out);
/* Makes `dev`'s primary context current on this thread. */
gca_status_t gca__cuda_enter_dev(const char *op, int dev);
/* Ensures some context is current: the thread's own, else its current device's. */
gca_status_t gca__cuda_enter_any(const char *op);
/* Makes the context of `stream` current (for NULL and the special handles of
 * Note [Special streams]: the current device's primary context). When `dev`
 * is not NULL, stores the device index, or GCA_ERR_INVALID_HANDLE when the
 * stream lives in a context other than a device's primary one. */
gca_status_t gca__cuda_enter_stream(const char *op, gca_stream_t stream, int *dev);
/* Installs the device, context and peer-access ops. */
void gca__cuda_device_ops(gca_device_ops_t *ops);

/* ---- cuda_mem.c ---- */

/* *out = 1 when memory on `dev` is made with fabric handles, else 0; settles
 * it first by a probe when not yet known (Note [Fabric handles]). A probe that
 * fails for another reason than a refusal is its status. */
gca_status_t gca__cuda_fabric_supported(int dev, int *out);
/* Installs the memory ops (mem_*, host_*). */
void gca__cuda_mem_ops(gca_device_ops_t *ops);

/* ---- cuda_stream.c ---- */

/* Installs the stream, event, host-function, copy and memset ops. */
void gca__cuda_stream_ops(gca_device_ops_t *ops);

/* ---- cuda_graph.c ---- */

/* Installs the capture and graph ops. */
void gca__cuda_graph_ops(gca_device_ops_t *ops);

/* ---- cuda_kernels.c ---- */

/* Installs the kernel ops (kernel_*). */
void gca__cuda_kernel_ops(gca_device_ops_t *ops);

#endif /* GCA_CUDA_FULL */

#endif
