/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_device.c - devices and contexts on the cuda backend: the device
 * queries, the thread's current device, peer access, synchronizing a device,
 * and how every op makes the right context current before it calls the
 * driver.
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
 */
#include <stdatomic.h>
#include <pthread.h>

#include "cuda_internal.h"

#ifdef GCA_CUDA_FULL

/* ---- contexts (Note [Cuda contexts]) ---- */

gca_status_t gca__cuda_check_dev(const char *op, int dev) {
  GCA_CHECK(gca__cuda_ready(op));
  if (dev < 0 || dev >= gca__cuda_lib.ndev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d is not in [0, %d)", op, dev,
                      gca__cuda_lib.ndev);
  return GCA_OK;
}

/* The retained primary context of `dev` (validated), retaining it on first use. */
gca_status_t gca__cuda_primary_ctx(const char *op, int dev, CUcontext *out) {
  CUcontext ctx = atomic_load_explicit(&gca__cuda_lib.dev[dev].ctx, memory_order_acquire);
  if (GCA_LIKELY(ctx != NULL)) {
    *out = ctx;
    return GCA_OK;
  }
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&gca__cuda_dev_lock);
  ctx = atomic_load_explicit(&gca__cuda_lib.dev[dev].ctx, memory_order_relaxed);
  if (!ctx) {
    CU_CHECK_GOTO(op, gca__cuda_drv.DevicePrimaryCtxRetain(&ctx, gca__cuda_lib.dev[dev].cudev), st,
                  out_unlock);
    atomic_store_explicit(&gca__cuda_lib.dev[dev].ctx, ctx, memory_order_release);
  }
  *out = ctx;
out_unlock:
  pthread_mutex_unlock(&gca__cuda_dev_lock);
  return st;
}

static gca_status_t make_current(const char *op, CUcontext ctx) {
  CUcontext cur = NULL;
  CU_CHECK(op, gca__cuda_drv.CtxGetCurrent(&cur));
  if (cur != ctx)
    CU_CHECK(op, gca__cuda_drv.CtxSetCurrent(ctx));
  return GCA_OK;
}

/* Makes `dev`'s primary context current on this thread. */
gca_status_t gca__cuda_enter_dev(const char *op, int dev) {
  GCA_CHECK(gca__cuda_check_dev(op, dev));
  CUcontext ctx = NULL;
  GCA_CHECK(gca__cuda_primary_ctx(op, dev, &ctx));
  return make_current(op, ctx);
}

/* The calling thread's current device (ctx_set_device); 0 until set. */
static _Thread_local int t_current_dev;

/* Ensures some context is current: the thread's own, else its current device's. */
gca_status_t gca__cuda_enter_any(const char *op) {
  GCA_CHECK(gca__cuda_ready(op));
  CUcontext cur = NULL;
  CU_CHECK(op, gca__cuda_drv.CtxGetCurrent(&cur));
  if (cur)
    return GCA_OK;
  return gca__cuda_enter_dev(op, t_current_dev);
}

/* Makes the context of `stream` current (for NULL and the special handles of
 * Note [Special streams], which the driver resolves in the current context:
 * the current device's primary context). When `dev` is not NULL, stores the
 * device index, or GCA_ERR_INVALID_HANDLE when the stream lives in a context
 * other than a device's primary one. */
gca_status_t gca__cuda_enter_stream(const char *op, gca_stream_t stream, int *dev) {
  if (stream == NULL || GCA_STREAM_IS_SPECIAL(stream)) {
    GCA_CHECK(gca__cuda_enter_dev(op, t_current_dev));
  } else {
    GCA_CHECK(gca__cuda_ready(op));
    CUcontext ctx = NULL;
    CU_CHECK(op, gca__cuda_drv.StreamGetCtx(stream, &ctx));
    GCA_CHECK(make_current(op, ctx));
  }
  if (!dev)
    return GCA_OK;
  CUdevice cudev;
  CU_CHECK(op, gca__cuda_drv.CtxGetDevice(&cudev));
  for (int i = 0; i < gca__cuda_lib.ndev; i++) {
    if (gca__cuda_lib.dev[i].cudev == cudev) {
      *dev = i;
      return GCA_OK;
    }
  }
  return gca__error(GCA_ERR_INVALID_HANDLE, "%s: stream %p is on an unknown device %d", op,
                    (void *)stream, (int)cudev);
}

/* ---- device queries ---- */

static gca_status_t cuda_device_count(int *count) {
  GCA_CHECK(gca__cuda_ready("device_count"));
  if (!count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = gca__cuda_lib.ndev;
  return GCA_OK;
}

static gca_status_t cuda_device_attr(int dev, gca_dev_attr_t attr, int *value) {
  GCA_CHECK(gca__cuda_check_dev("device_attr", dev));
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
  case GCA_ATTR_FABRIC_SUPPORTED: /* whether they can be made (Note [Fabric handles]) */
    if (!value)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_attr: value is NULL");
    return gca__cuda_fabric_supported(dev, value);
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
  CU_CHECK("device_attr", gca__cuda_drv.DeviceGetAttribute(value, a, gca__cuda_lib.dev[dev].cudev));
  return GCA_OK;
}

static gca_status_t cuda_device_name(int dev, char *name, size_t len) {
  GCA_CHECK(gca__cuda_check_dev("device_name", dev));
  if (!name || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_name: empty buffer");
  CU_CHECK("device_name", gca__cuda_drv.DeviceGetName(name, len > INT32_MAX ? INT32_MAX : (int)len,
                                                      gca__cuda_lib.dev[dev].cudev));
  return GCA_OK;
}

static gca_status_t cuda_device_can_access_peer(int dev, int peer, int *can) {
  GCA_CHECK(gca__cuda_check_dev("device_can_access_peer", dev));
  GCA_CHECK(gca__cuda_check_dev("device_can_access_peer", peer));
  CU_CHECK("device_can_access_peer",
           gca__cuda_drv.DeviceCanAccessPeer(can, gca__cuda_lib.dev[dev].cudev,
                                             gca__cuda_lib.dev[peer].cudev));
  return GCA_OK;
}

/* The driver refuses a context as its own peer with CUDA_ERROR_INVALID_CONTEXT;
 * that is a caller's mistake here, so it is caught before the call. */
static gca_status_t cuda_ctx_enable_peer_access(int dev, int peer) {
  GCA_CHECK(gca__cuda_check_dev("ctx_enable_peer_access", peer));
  if (dev == peer)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "ctx_enable_peer_access: device %d cannot be its own peer "
                      "(CUDA_ERROR_INVALID_CONTEXT)",
                      dev);
  CUcontext peer_ctx = NULL;
  GCA_CHECK(gca__cuda_primary_ctx("ctx_enable_peer_access", peer, &peer_ctx));
  GCA_CHECK(gca__cuda_enter_dev("ctx_enable_peer_access", dev));
  CU_CHECK("ctx_enable_peer_access", gca__cuda_drv.CtxEnablePeerAccess(peer_ctx, 0));
  return GCA_OK;
}

/* ---- the current device ---- */

static gca_status_t cuda_ctx_set_device(int dev) {
  GCA_CHECK(gca__cuda_enter_dev("ctx_set_device", dev));
  t_current_dev = dev;
  return GCA_OK;
}

static gca_status_t cuda_ctx_get_device(int *dev) {
  GCA_CHECK(gca__cuda_ready("ctx_get_device"));
  if (!dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ctx_get_device: dev is NULL");
  *dev = t_current_dev;
  return GCA_OK;
}

static gca_status_t cuda_stream_get_device(gca_stream_t stream, int *dev) {
  if (!dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_get_device: dev is NULL");
  if (stream == NULL || GCA_STREAM_IS_SPECIAL(stream)) {
    GCA_CHECK(gca__cuda_ready("stream_get_device"));
    *dev = t_current_dev;
    return GCA_OK;
  }
  return gca__cuda_enter_stream("stream_get_device", stream, dev);
}

static gca_status_t cuda_ctx_synchronize(int dev) {
  GCA_CHECK(gca__cuda_enter_dev("ctx_synchronize", dev));
  CU_CHECK("ctx_synchronize", gca__cuda_drv.CtxSynchronize());
  return GCA_OK;
}

void gca__cuda_device_ops(gca_device_ops_t *ops) {
  ops->device_count = cuda_device_count;
  ops->device_attr = cuda_device_attr;
  ops->device_name = cuda_device_name;
  ops->device_can_access_peer = cuda_device_can_access_peer;
  ops->ctx_enable_peer_access = cuda_ctx_enable_peer_access;
  ops->ctx_set_device = cuda_ctx_set_device;
  ops->ctx_get_device = cuda_ctx_get_device;
  ops->stream_get_device = cuda_stream_get_device;
  ops->ctx_synchronize = cuda_ctx_synchronize;
}

#endif /* GCA_CUDA_FULL */
