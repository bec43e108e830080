/* SPDX-License-Identifier: Apache-2.0 */
/* public.c - the public device API (gca/device.h): streams, events, copies,
 * memsets, kernels and capture on the backend gca_device_init() selected.
 *
 * One idea: every function checks what the caller owns (out-pointers, flag
 * bits) itself, then forwards to one operation of the active table and lets
 * its status through unchanged, prefixing the public name to the operation's
 * detail so a failure reads "gca_memcpy: memcpy_async: ...".
 */
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "device.h"

#define STREAM_FLAGS (GCA_STREAM_DEFAULT | GCA_STREAM_NON_BLOCKING)
#define EVENT_FLAGS  (GCA_EVENT_DEFAULT | GCA_EVENT_BLOCKING_SYNC | GCA_EVENT_DISABLE_TIMING)

static gca_devptr_t dptr(const void *p) {
  return (gca_devptr_t)(uintptr_t)p;
}

/* The active table, or NULL with *st set (the detail prefixed with `fn`). */
static const gca_device_ops_t *active(const char *fn, gca_status_t *st) {
  const gca_device_ops_t *ops = gca__device_get(st);
  if (!ops)
    gca__error_prefix(*st, "%s", fn);
  return ops;
}

static gca_status_t fwd(const char *fn, gca_status_t st) {
  return st == GCA_OK ? GCA_OK : gca__error_prefix(st, "%s", fn);
}

static gca_status_t null_arg(const char *fn, const char *what) {
  return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
}

#define ACTIVE(fn)                                  \
  gca_status_t st_;                                 \
  const gca_device_ops_t *ops = active((fn), &st_); \
  if (!ops)                                         \
  return st_

/* The calling thread's current device as the device layer knows it. */
static gca_status_t current_device(const char *fn, const gca_device_ops_t *ops, int *dev) {
  return fwd(fn, ops->ctx_get_device(dev));
}

/* ---- streams ---- */

GCA_API gca_status_t gca_stream_create(gca_stream_t *stream, unsigned flags) {
  static const char fn[] = "gca_stream_create";
  if (!stream)
    return null_arg(fn, "the stream out-pointer");
  if (flags & ~STREAM_FLAGS)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: flags 0x%x has bits outside GCA_STREAM_NON_BLOCKING", fn, flags);
  ACTIVE(fn);
  int dev = 0;
  GCA_CHECK(current_device(fn, ops, &dev));
  return fwd(fn, ops->stream_create(dev, flags, 0, stream));
}

GCA_API gca_status_t gca_stream_destroy(gca_stream_t stream) {
  static const char fn[] = "gca_stream_destroy";
  if (!stream)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: the legacy (NULL) stream cannot be destroyed",
                      fn);
  ACTIVE(fn);
  return fwd(fn, gca__stream_destroy_retired(ops, stream));
}

GCA_API gca_status_t gca_stream_synchronize(gca_stream_t stream) {
  ACTIVE("gca_stream_synchronize");
  return fwd("gca_stream_synchronize", ops->stream_synchronize(stream));
}

GCA_API gca_status_t gca_stream_query(gca_stream_t stream) {
  ACTIVE("gca_stream_query");
  return fwd("gca_stream_query", ops->stream_query(stream));
}

GCA_API gca_status_t gca_stream_wait_event(gca_stream_t stream, gca_event_t event) {
  static const char fn[] = "gca_stream_wait_event";
  if (!event)
    return null_arg(fn, "event");
  ACTIVE(fn);
  return fwd(fn, ops->stream_wait_event(stream, event));
}

GCA_API gca_status_t gca_launch_host_func(gca_stream_t stream, gca_host_fn_t fn_, void *user_data) {
  static const char fn[] = "gca_launch_host_func";
  if (!fn_)
    return null_arg(fn, "the host function");
  ACTIVE(fn);
  return fwd(fn, ops->launch_host_func(stream, fn_, user_data));
}

/* ---- events ---- */

GCA_API gca_status_t gca_event_create(gca_event_t *event, unsigned flags) {
  static const char fn[] = "gca_event_create";
  if (!event)
    return null_arg(fn, "the event out-pointer");
  if (flags & ~EVENT_FLAGS)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: flags 0x%x has bits outside GCA_EVENT_BLOCKING_SYNC | "
                      "GCA_EVENT_DISABLE_TIMING",
                      fn, flags);
  ACTIVE(fn);
  int dev = 0;
  GCA_CHECK(current_device(fn, ops, &dev));
  return fwd(fn, ops->event_create(dev, flags, event));
}

GCA_API gca_status_t gca_event_destroy(gca_event_t event) {
  static const char fn[] = "gca_event_destroy";
  if (!event)
    return null_arg(fn, "event");
  ACTIVE(fn);
  return fwd(fn, ops->event_destroy(event));
}

GCA_API gca_status_t gca_event_record(gca_event_t event, gca_stream_t stream) {
  static const char fn[] = "gca_event_record";
  if (!event)
    return null_arg(fn, "event");
  ACTIVE(fn);
  return fwd(fn, ops->event_record(event, stream));
}

GCA_API gca_status_t gca_event_synchronize(gca_event_t event) {
  static const char fn[] = "gca_event_synchronize";
  if (!event)
    return null_arg(fn, "event");
  ACTIVE(fn);
  return fwd(fn, ops->event_synchronize(event));
}

GCA_API gca_status_t gca_event_query(gca_event_t event) {
  static const char fn[] = "gca_event_query";
  if (!event)
    return null_arg(fn, "event");
  ACTIVE(fn);
  return fwd(fn, ops->event_query(event));
}

GCA_API gca_status_t gca_event_elapsed_time(float *ms, gca_event_t start, gca_event_t end) {
  static const char fn[] = "gca_event_elapsed_time";
  if (!ms)
    return null_arg(fn, "the milliseconds out-pointer");
  if (!start || !end)
    return null_arg(fn, !start ? "start" : "end");
  ACTIVE(fn);
  return fwd(fn, ops->event_elapsed(start, end, ms));
}

/* ---- copies and memsets ---- */

GCA_API gca_status_t gca_memcpy_async(void *dst, const void *src, size_t bytes,
                                      gca_stream_t stream) {
  static const char fn[] = "gca_memcpy_async";
  if (bytes && (!dst || !src))
    return null_arg(fn, !dst ? "dst" : "src");
  ACTIVE(fn);
  return fwd(fn, ops->memcpy_async(dptr(dst), dptr(src), bytes, stream));
}

/* The synchronous copies and memsets queue on the legacy stream and wait for
 * it, as cuMemcpy/cuMemsetD8 return once done. When that wait fails the work
 * may still be queued and would write the caller's memory after the error is
 * returned (a stack buffer, say): wait it out (retries, then the device)
 * before reporting the first failure. */
static gca_status_t sync_legacy(const char *fn, const gca_device_ops_t *ops) {
  gca_status_t st = ops->stream_synchronize(NULL);
  if (st == GCA_OK)
    return GCA_OK;
  st = fwd(fn, st);
  char detail[256];
  snprintf(detail, sizeof(detail), "%s", gca_last_error());
  bool done = false;
  for (int i = 0; i < 8 && !done; i++)
    done = ops->stream_synchronize(NULL) == GCA_OK;
  int dev = 0;
  for (int i = 0; i < 8 && !done; i++)
    done = ops->ctx_get_device(&dev) == GCA_OK && ops->ctx_synchronize(dev) == GCA_OK;
  return gca__error(st, "%s", detail);
}

GCA_API gca_status_t gca_memcpy(void *dst, const void *src, size_t bytes) {
  static const char fn[] = "gca_memcpy";
  if (bytes && (!dst || !src))
    return null_arg(fn, !dst ? "dst" : "src");
  ACTIVE(fn);
  GCA_CHECK(fwd(fn, ops->memcpy_async(dptr(dst), dptr(src), bytes, NULL)));
  return sync_legacy(fn, ops);
}

GCA_API gca_status_t gca_memset_d8_async(void *dst, uint8_t value, size_t count,
                                         gca_stream_t stream) {
  static const char fn[] = "gca_memset_d8_async";
  if (count && !dst)
    return null_arg(fn, "dst");
  ACTIVE(fn);
  return fwd(fn, ops->memset_d8_async(dptr(dst), value, count, stream));
}

GCA_API gca_status_t gca_memset_d32_async(void *dst, uint32_t value, size_t count,
                                          gca_stream_t stream) {
  static const char fn[] = "gca_memset_d32_async";
  if (count && !dst)
    return null_arg(fn, "dst");
  ACTIVE(fn);
  return fwd(fn, ops->memset_d32_async(dptr(dst), value, count, stream));
}

GCA_API gca_status_t gca_memset_d8(void *dst, uint8_t value, size_t count) {
  static const char fn[] = "gca_memset_d8";
  if (count && !dst)
    return null_arg(fn, "dst");
  ACTIVE(fn);
  GCA_CHECK(fwd(fn, ops->memset_d8_async(dptr(dst), value, count, NULL)));
  return sync_legacy(fn, ops);
}

GCA_API gca_status_t gca_memset_d32(void *dst, uint32_t value, size_t count) {
  static const char fn[] = "gca_memset_d32";
  if (count && !dst)
    return null_arg(fn, "dst");
  ACTIVE(fn);
  GCA_CHECK(fwd(fn, ops->memset_d32_async(dptr(dst), value, count, NULL)));
  return sync_legacy(fn, ops);
}

/* ---- the device ---- */

GCA_API gca_status_t gca_device_synchronize(void) {
  static const char fn[] = "gca_device_synchronize";
  ACTIVE(fn);
  int dev = 0;
  GCA_CHECK(current_device(fn, ops, &dev));
  return fwd(fn, ops->ctx_synchronize(dev));
}

GCA_API gca_status_t gca_mem_get_info(size_t *free_bytes, size_t *total_bytes) {
  static const char fn[] = "gca_mem_get_info";
  if (!free_bytes || !total_bytes)
    return null_arg(fn, !free_bytes ? "free_bytes" : "total_bytes");
  ACTIVE(fn);
  int dev = 0;
  GCA_CHECK(current_device(fn, ops, &dev));
  return fwd(fn, ops->mem_get_info(dev, free_bytes, total_bytes));
}

GCA_API gca_status_t gca_device_name(int device, char *name, size_t len) {
  static const char fn[] = "gca_device_name";
  if (!name || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: the name buffer is %s", fn,
                      !name ? "NULL" : "empty");
  ACTIVE(fn);
  return fwd(fn, ops->device_name(device, name, len));
}

/* ---- kernels ---- */

GCA_API gca_status_t gca_kernel_fill_u32(void *dst, uint32_t value, uint32_t step, size_t count,
                                         gca_stream_t stream) {
  static const char fn[] = "gca_kernel_fill_u32";
  if (count && !dst)
    return null_arg(fn, "dst");
  ACTIVE(fn);
  return fwd(fn, ops->kernel_fill_u32(dptr(dst), value, step, count, stream));
}

GCA_API gca_status_t gca_kernel_add_u32(void *dst, const void *a, const void *b, size_t count,
                                        gca_stream_t stream) {
  static const char fn[] = "gca_kernel_add_u32";
  if (count && (!dst || !a || !b))
    return null_arg(fn, !dst ? "dst" : !a ? "a" : "b");
  ACTIVE(fn);
  return fwd(fn, ops->kernel_add_u32(dptr(dst), dptr(a), dptr(b), count, stream));
}

GCA_API gca_status_t gca_kernel_copy_batch(const void *table, size_t n, gca_stream_t stream) {
  static const char fn[] = "gca_kernel_copy_batch";
  if (n && !table)
    return null_arg(fn, "table");
  ACTIVE(fn);
  return fwd(fn, ops->kernel_copy_batch(dptr(table), n, stream));
}

/* The compute kernels' arguments are checked here, before the backend is
 * called, with the checks both backends make for callers of the table
 * (compute.c). */
GCA_API gca_status_t gca_kernel_gemm_f32(void *c, const void *a, const void *b, uint32_t m,
                                         uint32_t n, uint32_t k, uint32_t flags,
                                         gca_stream_t stream) {
  static const char fn[] = "gca_kernel_gemm_f32";
  gca__compute_span_t span;
  GCA_CHECK(fwd(fn, gca__check_gemm_f32(dptr(c), dptr(a), dptr(b), m, n, k, flags, &span)));
  ACTIVE(fn);
  return fwd(fn, ops->kernel_gemm_f32(dptr(c), dptr(a), dptr(b), m, n, k, flags, stream));
}

GCA_API gca_status_t gca_kernel_ew_f32(gca_ew_op_t op, void *dst, const void *a, const void *b,
                                       float s, uint32_t u, size_t count, gca_stream_t stream) {
  static const char fn[] = "gca_kernel_ew_f32";
  gca__compute_span_t span;
  GCA_CHECK(fwd(fn, gca__check_ew_f32(op, dptr(dst), dptr(a), dptr(b), count, &span)));
  ACTIVE(fn);
  return fwd(fn, ops->kernel_ew_f32(op, dptr(dst), dptr(a), dptr(b), s, u, count, stream));
}

GCA_API gca_status_t gca_kernel_dot_f32(void *dst, const void *a, const void *b, size_t count,
                                        float s, gca_stream_t stream) {
  static const char fn[] = "gca_kernel_dot_f32";
  gca__compute_span_t span;
  GCA_CHECK(fwd(fn, gca__check_dot_f32(dptr(dst), dptr(a), dptr(b), count, &span)));
  ACTIVE(fn);
  return fwd(fn, ops->kernel_dot_f32(dptr(dst), dptr(a), dptr(b), count, s, stream));
}

GCA_API gca_status_t gca_kernel_sleep(uint64_t ns, gca_stream_t stream) {
  ACTIVE("gca_kernel_sleep");
  return fwd("gca_kernel_sleep", ops->kernel_sleep(ns, stream));
}

/* ---- capture and graphs ---- */

GCA_API gca_status_t gca_stream_begin_capture(gca_stream_t stream, gca_capture_mode_t mode) {
  static const char fn[] = "gca_stream_begin_capture";
  if (mode != GCA_CAPTURE_MODE_GLOBAL && mode != GCA_CAPTURE_MODE_THREAD_LOCAL &&
      mode != GCA_CAPTURE_MODE_RELAXED)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: capture mode %d is not a gca_capture_mode_t",
                      fn, (int)mode);
  ACTIVE(fn);
  return fwd(fn, ops->stream_begin_capture(stream, mode));
}

GCA_API gca_status_t gca_stream_end_capture(gca_stream_t stream, gca_graph_t *graph) {
  static const char fn[] = "gca_stream_end_capture";
  if (!graph)
    return null_arg(fn, "the graph out-pointer");
  ACTIVE(fn);
  return fwd(fn, ops->stream_end_capture(stream, graph));
}

GCA_API gca_status_t gca_stream_capture_status(gca_stream_t stream, gca_capture_status_t *status) {
  static const char fn[] = "gca_stream_capture_status";
  if (!status)
    return null_arg(fn, "the status out-pointer");
  ACTIVE(fn);
  return fwd(fn, ops->stream_capture_info(stream, status, NULL));
}

GCA_API gca_status_t gca_graph_instantiate(gca_graph_exec_t *exec, gca_graph_t graph) {
  static const char fn[] = "gca_graph_instantiate";
  if (!exec)
    return null_arg(fn, "the exec out-pointer");
  if (!graph)
    return null_arg(fn, "graph");
  ACTIVE(fn);
  return fwd(fn, ops->graph_instantiate(graph, exec));
}

GCA_API gca_status_t gca_graph_launch(gca_graph_exec_t exec, gca_stream_t stream) {
  static const char fn[] = "gca_graph_launch";
  if (!exec)
    return null_arg(fn, "exec");
  ACTIVE(fn);
  return fwd(fn, ops->graph_launch(exec, stream));
}

GCA_API gca_status_t gca_graph_destroy(gca_graph_t graph) {
  static const char fn[] = "gca_graph_destroy";
  if (!graph)
    return null_arg(fn, "graph");
  ACTIVE(fn);
  return fwd(fn, ops->graph_destroy(graph));
}

GCA_API gca_status_t gca_graph_exec_destroy(gca_graph_exec_t exec) {
  static const char fn[] = "gca_graph_exec_destroy";
  if (!exec)
    return null_arg(fn, "exec");
  ACTIVE(fn);
  return fwd(fn, ops->graph_exec_destroy(exec));
}
