/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_stream.c - streams, events and the work queued on a stream (host
 * functions, copies, memsets) on the cuda backend.
 *
 * The one idea: each op makes the stream's context current (Note [Cuda
 * contexts]; the thread's current device's for the NULL and special streams)
 * and is then one driver call.
 */
#include "cuda_internal.h"

#ifdef GCA_CUDA_FULL

/* ---- streams and events ---- */

static gca_status_t cuda_stream_create(int dev, unsigned flags, int priority, gca_stream_t *out) {
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_create: out is NULL");
  GCA_CHECK(gca__cuda_enter_dev("stream_create", dev));
  CUstream s = NULL;
  CU_CHECK("stream_create", gca__cuda_drv.StreamCreateWithPriority(&s, flags, priority));
  *out = s;
  return GCA_OK;
}

static gca_status_t cuda_stream_destroy(gca_stream_t stream) {
  GCA_CHECK(gca__cuda_ready("stream_destroy"));
  if (!stream || GCA_STREAM_IS_SPECIAL(stream))
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "stream_destroy: the %s default stream (%p) cannot be destroyed",
                      stream == GCA_STREAM_PER_THREAD ? "per-thread" : "legacy", (void *)stream);
  GCA_CHECK(gca__cuda_enter_stream("stream_destroy", stream, NULL));
  CU_CHECK("stream_destroy", gca__cuda_drv.StreamDestroy(stream));
  return GCA_OK;
}

static gca_status_t cuda_stream_synchronize(gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("stream_synchronize", stream, NULL));
  CU_CHECK("stream_synchronize", gca__cuda_drv.StreamSynchronize(stream));
  return GCA_OK;
}

static gca_status_t cuda_stream_query(gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("stream_query", stream, NULL));
  CU_CHECK("stream_query", gca__cuda_drv.StreamQuery(stream));
  return GCA_OK;
}

static gca_status_t cuda_stream_wait_event(gca_stream_t stream, gca_event_t event) {
  GCA_CHECK(gca__cuda_enter_stream("stream_wait_event", stream, NULL));
  CU_CHECK("stream_wait_event", gca__cuda_drv.StreamWaitEvent(stream, event, 0));
  return GCA_OK;
}

static gca_status_t cuda_event_create(int dev, unsigned flags, gca_event_t *out) {
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "event_create: out is NULL");
  GCA_CHECK(gca__cuda_enter_dev("event_create", dev));
  CUevent e = NULL;
  CU_CHECK("event_create", gca__cuda_drv.EventCreate(&e, flags));
  *out = e;
  return GCA_OK;
}

static gca_status_t cuda_event_destroy(gca_event_t event) {
  GCA_CHECK(gca__cuda_enter_any("event_destroy"));
  CU_CHECK("event_destroy", gca__cuda_drv.EventDestroy(event));
  return GCA_OK;
}

static gca_status_t cuda_event_record(gca_event_t event, gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("event_record", stream, NULL));
  CU_CHECK("event_record", gca__cuda_drv.EventRecord(event, stream));
  return GCA_OK;
}

static gca_status_t cuda_event_query(gca_event_t event) {
  GCA_CHECK(gca__cuda_enter_any("event_query"));
  CU_CHECK("event_query", gca__cuda_drv.EventQuery(event));
  return GCA_OK;
}

static gca_status_t cuda_event_synchronize(gca_event_t event) {
  GCA_CHECK(gca__cuda_enter_any("event_synchronize"));
  CU_CHECK("event_synchronize", gca__cuda_drv.EventSynchronize(event));
  return GCA_OK;
}

static gca_status_t cuda_event_elapsed(gca_event_t start, gca_event_t end, float *ms) {
  /* the driver answers a NULL ms with CUDA_ERROR_INVALID_HANDLE (H200, driver 580) */
  if (!ms)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "event_elapsed: ms is NULL");
  GCA_CHECK(gca__cuda_enter_any("event_elapsed"));
  if (gca__cuda_drv.EventElapsedTime_v2)
    CU_CHECK("event_elapsed", gca__cuda_drv.EventElapsedTime_v2(ms, start, end));
  else
    CU_CHECK("event_elapsed", gca__cuda_drv.EventElapsedTime_v1(ms, start, end));
  return GCA_OK;
}

/* ---- stream work ---- */

static gca_status_t cuda_launch_host_func(gca_stream_t stream, gca_host_fn_t fn, void *user_data) {
  GCA_CHECK(gca__cuda_enter_stream("launch_host_func", stream, NULL));
  CU_CHECK("launch_host_func", gca__cuda_drv.LaunchHostFunc(stream, fn, user_data));
  return GCA_OK;
}

static gca_status_t cuda_memcpy_async(gca_devptr_t dst, gca_devptr_t src, size_t bytes,
                                      gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("memcpy_async", stream, NULL));
  CU_CHECK("memcpy_async",
           gca__cuda_drv.MemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, bytes, stream));
  return GCA_OK;
}

static gca_status_t cuda_memset_d8_async(gca_devptr_t dst, uint8_t value, size_t count,
                                         gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("memset_d8_async", stream, NULL));
  CU_CHECK("memset_d8_async", gca__cuda_drv.MemsetD8Async((CUdeviceptr)dst, value, count, stream));
  return GCA_OK;
}

static gca_status_t cuda_memset_d32_async(gca_devptr_t dst, uint32_t value, size_t count,
                                          gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("memset_d32_async", stream, NULL));
  CU_CHECK("memset_d32_async",
           gca__cuda_drv.MemsetD32Async((CUdeviceptr)dst, value, count, stream));
  return GCA_OK;
}

void gca__cuda_stream_ops(gca_device_ops_t *ops) {
  ops->stream_create = cuda_stream_create;
  ops->stream_destroy = cuda_stream_destroy;
  ops->stream_synchronize = cuda_stream_synchronize;
  ops->stream_query = cuda_stream_query;
  ops->stream_wait_event = cuda_stream_wait_event;
  ops->event_create = cuda_event_create;
  ops->event_destroy = cuda_event_destroy;
  ops->event_record = cuda_event_record;
  ops->event_query = cuda_event_query;
  ops->event_synchronize = cuda_event_synchronize;
  ops->event_elapsed = cuda_event_elapsed;
  ops->launch_host_func = cuda_launch_host_func;
  ops->memcpy_async = cuda_memcpy_async;
  ops->memset_d8_async = cuda_memset_d8_async;
  ops->memset_d32_async = cuda_memset_d32_async;
}

#endif /* GCA_CUDA_FULL */
