/* SPDX-License-Identifier: Apache-2.0 */
/* sim_work.c - the sim's units of stream work: what each kind does when a
 * stream's worker (or a graph replay) runs it, the memory checks that turn a
 * bad pointer into a kept fault instead of a crash, and the ops that make
 * work (host functions, copies, memsets, the ready-made kernels, the compute
 * kernels whose arithmetic is sim_compute.c's) and hand it to sim_stream.c to
 * queue or capture.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "philox.h"
#include "sim_stream.h"

/* ---- work ---- */

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

bool gca__sim_is_device_mem(gca_devptr_t p, size_t len) {
  return len == 0 || gca__sim_mem_device_of(p, len) >= 0;
}

bool gca__sim_is_host_mem(gca_devptr_t p, size_t len) {
  if (len == 0)
    return true;
  if (p + len < p || gca__sim_mem_in_device_space(p, len))
    return false;
  /* mincore fails with ENOMEM when a page of the range is not mapped */
  static const size_t page = 4096;
  unsigned char vec[64];
  uint64_t at = p & ~(uint64_t)(page - 1), end = p + len;
  while (at < end) {
    uint64_t chunk = end - at < sizeof(vec) * page ? end - at : sizeof(vec) * page;
    if (mincore((void *)(uintptr_t)at, (size_t)chunk, vec) != 0)
      return false;
    at += chunk;
  }
  return true;
}

static bool fault_if(bool bad, gca__sim_fault_t *fault, const char *what, gca_devptr_t addr,
                     size_t len) {
  if (bad && !fault->what)
    *fault = (gca__sim_fault_t){.what = what, .addr = addr, .len = len};
  return bad;
}

/* Whether a work item may run: its device sides are mapped device memory and
 * a copy's other side host memory (Note [Sim memory faults]). */
/* A copy batch's table and every entry's two sides are mapped device memory. */
static bool copy_batch_ok(const gca__sim_work_t *w, gca__sim_fault_t *fault) {
  size_t tb = w->count * sizeof(gca_copy_entry_t);
  if (fault_if(!gca__sim_is_device_mem(w->a, tb), fault, "kernel copy_batch (table)", w->a, tb))
    return false;
  const gca_copy_entry_t *e = (const gca_copy_entry_t *)(uintptr_t)w->a;
  for (size_t i = 0; i < w->count; i++)
    if (fault_if(!gca__sim_is_device_mem(e[i].dst, e[i].bytes), fault, "kernel copy_batch",
                 e[i].dst, e[i].bytes) ||
        fault_if(!gca__sim_is_device_mem(e[i].src, e[i].bytes), fault, "kernel copy_batch",
                 e[i].src, e[i].bytes))
      return false;
  return true;
}

/* A compute kernel's operands (the bytes it touches through each) are mapped
 * device memory. */
static bool compute_ok(const gca__sim_work_t *w, const char *what, gca__sim_fault_t *fault) {
  gca__compute_span_t s = gca__sim_compute_span(w);
  return !fault_if(!gca__sim_is_device_mem(w->dst, s.dst), fault, what, w->dst, s.dst) &&
         !fault_if(!gca__sim_is_device_mem(w->a, s.a), fault, what, w->a, s.a) &&
         !fault_if(!gca__sim_is_device_mem(w->b, s.b), fault, what, w->b, s.b);
}

static bool work_memory_ok(const gca__sim_work_t *w, gca__sim_fault_t *fault) {
  size_t words = w->count * 4;
  switch (w->kind) {
  case GCA__SIM_WORK_MEMCPY:
    if (w->staged)
      return !fault_if(!gca__sim_is_device_mem(w->dst, w->count), fault, "memcpy", w->dst,
                       w->count);
    return !fault_if(!gca__sim_is_device_mem(w->dst, w->count) &&
                         !gca__sim_is_host_mem(w->dst, w->count),
                     fault, "memcpy", w->dst, w->count) &&
           !fault_if(!gca__sim_is_device_mem(w->a, w->count) &&
                         !gca__sim_is_host_mem(w->a, w->count),
                     fault, "memcpy", w->a, w->count);
  case GCA__SIM_WORK_MEMSET8:
    return !fault_if(!gca__sim_is_device_mem(w->dst, w->count), fault, "memset", w->dst, w->count);
  case GCA__SIM_WORK_COPY_BATCH:
    return copy_batch_ok(w, fault);
  case GCA__SIM_WORK_MEMSET32:
    return !fault_if(!gca__sim_is_device_mem(w->dst, words), fault, "memset", w->dst, words);
  case GCA__SIM_WORK_FILL:
    return !fault_if(!gca__sim_is_device_mem(w->dst, words), fault, "kernel fill_u32", w->dst,
                     words);
  case GCA__SIM_WORK_ADD:
    return !fault_if(!gca__sim_is_device_mem(w->dst, words), fault, "kernel add_u32", w->dst,
                     words) &&
           !fault_if(!gca__sim_is_device_mem(w->a, words), fault, "kernel add_u32", w->a, words) &&
           !fault_if(!gca__sim_is_device_mem(w->b, words), fault, "kernel add_u32", w->b, words);
  case GCA__SIM_WORK_GEMM:
    return compute_ok(w, "kernel gemm_f32", fault);
  case GCA__SIM_WORK_EW:
    return compute_ok(w, "kernel ew_f32", fault);
  case GCA__SIM_WORK_DOT:
    return compute_ok(w, "kernel dot_f32", fault);
  default:
    return true;
  }
}

void gca__sim_work_run(const gca__sim_work_t *w, gca__sim_fault_t *fault) {
  if (!work_memory_ok(w, fault))
    return;
  switch (w->kind) {
  case GCA__SIM_WORK_HOST: {
    bool outer = gca__sim_in_host_fn;
    gca__sim_in_host_fn = true;
    w->fn(w->user_data);
    gca__sim_in_host_fn = outer;
    break;
  }
  case GCA__SIM_WORK_MEMCPY:
    memmove((void *)(uintptr_t)w->dst, w->staged ? w->staged : (const void *)(uintptr_t)w->a,
            w->count);
    break;
  case GCA__SIM_WORK_MEMSET8:
    memset((void *)(uintptr_t)w->dst, (int)(w->value & 0xffu), w->count);
    break;
  case GCA__SIM_WORK_MEMSET32: {
    uint32_t *d = (uint32_t *)(uintptr_t)w->dst;
    for (size_t i = 0; i < w->count; i++)
      d[i] = w->value;
    break;
  }
  case GCA__SIM_WORK_FILL: {
    uint32_t *d = (uint32_t *)(uintptr_t)w->dst;
    for (size_t i = 0; i < w->count; i++)
      d[i] = w->value + (uint32_t)i * w->step;
    break;
  }
  case GCA__SIM_WORK_ADD: {
    uint32_t *d = (uint32_t *)(uintptr_t)w->dst;
    const uint32_t *x = (const uint32_t *)(uintptr_t)w->a;
    const uint32_t *y = (const uint32_t *)(uintptr_t)w->b;
    for (size_t i = 0; i < w->count; i++)
      d[i] = x[i] + y[i];
    break;
  }
  case GCA__SIM_WORK_SLEEP:
    if (!gca__sim_clock_virtual())
      sleep_ns(w->ns);
    else /* Note [Sim virtual time] */
      gca__sim_clock_advance_to(gca__sim_clock_now() + w->ns);
    break;
  case GCA__SIM_WORK_GRAPH:
    gca__sim_image_run(w->graph, fault);
    break;
  case GCA__SIM_WORK_COPY_BATCH: {
    const gca_copy_entry_t *e = (const gca_copy_entry_t *)(uintptr_t)w->a;
    for (size_t i = 0; i < w->count; i++)
      memmove((void *)(uintptr_t)e[i].dst, (const void *)(uintptr_t)e[i].src, e[i].bytes);
    break;
  }
  case GCA__SIM_WORK_PHILOX: {
    uint64_t seed = *(const uint64_t *)(uintptr_t)w->a;
    uint64_t offset = *(const uint64_t *)(uintptr_t)w->b + w->offset;
    gca__philox_fill((uint32_t *)(uintptr_t)w->dst, w->count, seed, offset);
    break;
  }
  case GCA__SIM_WORK_GEMM:
  case GCA__SIM_WORK_EW:
  case GCA__SIM_WORK_DOT:
    gca__sim_compute_run(w);
    break;
  }
}

void gca__sim_work_hold(const gca__sim_work_t *w) {
  if (w->kind == GCA__SIM_WORK_GRAPH)
    gca__sim_image_ref(w->graph);
}

void gca__sim_work_release(gca__sim_work_t *w) {
  free(w->staged);
  w->staged = NULL;
  if (w->kind == GCA__SIM_WORK_GRAPH && w->graph) {
    gca__sim_image_unref(w->graph);
    w->graph = NULL;
  }
}

/* ---- work ops ---- */

static gca_status_t sim_launch_host_func(gca_stream_t stream, gca_host_fn_t fn, void *user_data) {
  GCA_SIM_ENTER(launch_host_func, 0);
  if (!fn)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "launch_host_func: fn is NULL");
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_HOST, .fn = fn, .user_data = user_data};
  return gca__sim_stream_submit("launch_host_func", stream, &w, NULL);
}

/* Note [Sim copies]: as cuMemcpyAsync ("API synchronization behavior" in the
 * driver's documentation): each side must be mapped device memory or host
 * memory, else GCA_ERR_INVALID_ARGUMENT at the call (CUDA_ERROR_INVALID_VALUE)
 * and nothing is queued. Host memory is pinned when host_alloc or
 * host_register made it so (sim_host.c), else pageable, and the two behave as
 * on the driver:
 *   - from pageable host memory to the device: the source is read at the call
 *     (staged), so the caller may reuse it as soon as the call returns;
 *   - from the device to pageable host memory: the call returns once the copy
 *     has landed (after the stream's earlier work);
 *   - host to host, pinned or not: synchronous with respect to the host;
 *   - every other copy (pinned host memory on either side, device to device)
 *     is stream-ordered and truly asynchronous: a pinned source is read when
 *     the stream reaches the copy, not at the call.
 * A copy with a side in pageable host memory is captured like any other and
 * its node reads (or writes) the host memory when a launch reaches it, not at
 * the capture: so the driver does (H200, driver 580, CUDA 13.0; cuda.h does
 * not say). */
static gca_status_t sim_memcpy_async(gca_devptr_t dst, gca_devptr_t src, size_t bytes,
                                     gca_stream_t stream) {
  GCA_SIM_ENTER(memcpy_async, 0);
  if (bytes > 0 && (!dst || !src))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "memcpy_async: NULL %s pointer for a copy of %zu bytes",
                      !dst ? "destination" : "source", bytes);
  bool dst_dev = gca__sim_is_device_mem(dst, bytes), src_dev = gca__sim_is_device_mem(src, bytes);
  bool dst_host = !dst_dev && gca__sim_is_host_mem(dst, bytes);
  bool src_host = !src_dev && gca__sim_is_host_mem(src, bytes);
  if ((!dst_dev && !dst_host) || (!src_dev && !src_host)) {
    bool bad_dst = !dst_dev && !dst_host;
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "memcpy_async: %s [0x%llx, +%zu) is neither mapped device memory nor host "
                      "memory (CUDA_ERROR_INVALID_VALUE)",
                      bad_dst ? "destination" : "source", (unsigned long long)(bad_dst ? dst : src),
                      bytes);
  }
  bool src_pageable = src_host && !gca__sim_host_is_pinned(src, bytes);
  bool dst_pageable = dst_host && !gca__sim_host_is_pinned(dst, bytes);
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_MEMCPY, .dst = dst, .a = src, .count = bytes};
  bool stage = src_pageable && dst_dev;
  bool sync = (src_host && dst_host) || (src_dev && dst_pageable);
  return gca__sim_stream_submit_copy("memcpy_async", stream, &w, stage, sync);
}

/* A memset's target must be mapped device memory (CUDA_ERROR_INVALID_VALUE otherwise). */
static gca_status_t memset_target(const char *op, gca_devptr_t dst, size_t bytes) {
  if (gca__sim_is_device_mem(dst, bytes))
    return GCA_OK;
  return gca__error(GCA_ERR_INVALID_ARGUMENT,
                    "%s: [0x%llx, +%zu) is not mapped device memory (CUDA_ERROR_INVALID_VALUE)", op,
                    (unsigned long long)dst, bytes);
}

static gca_status_t sim_memset_d8_async(gca_devptr_t dst, uint8_t value, size_t count,
                                        gca_stream_t stream) {
  GCA_SIM_ENTER(memset_d8_async, 0);
  if (count > 0 && !dst)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "memset_d8_async: dst is NULL (count %zu)", count);
  GCA_CHECK(memset_target("memset_d8_async", dst, count));
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_MEMSET8, .dst = dst, .value = value, .count = count};
  return gca__sim_stream_submit("memset_d8_async", stream, &w, NULL);
}

static gca_status_t sim_memset_d32_async(gca_devptr_t dst, uint32_t value, size_t count,
                                         gca_stream_t stream) {
  GCA_SIM_ENTER(memset_d32_async, 0);
  if (count > 0 && (!dst || (dst & 3u)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "memset_d32_async: dst 0x%llx is not a 4-byte aligned device pointer",
                      (unsigned long long)dst);
  if (count > SIZE_MAX / 4)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "memset_d32_async: count %zu is too large", count);
  GCA_CHECK(memset_target("memset_d32_async", dst, count * 4));
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_MEMSET32, .dst = dst, .value = value, .count = count};
  return gca__sim_stream_submit("memset_d32_async", stream, &w, NULL);
}

static gca_status_t sim_kernel_fill_u32(gca_devptr_t dst, uint32_t value, uint32_t step,
                                        size_t count, gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_fill_u32, 0);
  if (count > 0 && (!dst || (dst & 3u)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "kernel_fill_u32: dst 0x%llx is not a 4-byte aligned device pointer",
                      (unsigned long long)dst);
  gca__sim_work_t w = {
      .kind = GCA__SIM_WORK_FILL, .dst = dst, .value = value, .step = step, .count = count};
  return gca__sim_stream_submit("kernel_fill_u32", stream, &w, NULL);
}

static gca_status_t sim_kernel_add_u32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                       size_t count, gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_add_u32, 0);
  if (count > 0 && (!dst || !a || !b || ((dst | a | b) & 3u)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "kernel_add_u32: dst 0x%llx, a 0x%llx, b 0x%llx must be 4-byte aligned "
                      "device pointers",
                      (unsigned long long)dst, (unsigned long long)a, (unsigned long long)b);
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_ADD, .dst = dst, .a = a, .b = b, .count = count};
  return gca__sim_stream_submit("kernel_add_u32", stream, &w, NULL);
}

static gca_status_t sim_kernel_sleep(uint64_t ns, gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_sleep, 0);
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_SLEEP, .ns = ns};
  return gca__sim_stream_submit("kernel_sleep", stream, &w, NULL);
}

static gca_status_t sim_kernel_copy_batch(gca_devptr_t table, size_t n, gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_copy_batch, 0);
  if (n > 0 && (!table || (table & 7u) || n > SIZE_MAX / sizeof(gca_copy_entry_t)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "kernel_copy_batch: table 0x%llx must be an 8-byte aligned device pointer "
                      "(%zu entries)",
                      (unsigned long long)table, n);
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_COPY_BATCH, .a = table, .count = n};
  return gca__sim_stream_submit("kernel_copy_batch", stream, &w, NULL);
}

static gca_status_t sim_kernel_philox_u32(gca_devptr_t dst, size_t count, gca_devptr_t seed_ptr,
                                          gca_devptr_t offset_ptr, uint64_t offset_add,
                                          gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_philox_u32, 0);
  if (count > 0 &&
      (!dst || (dst & 3u) || !seed_ptr || (seed_ptr & 7u) || !offset_ptr || (offset_ptr & 7u)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "kernel_philox_u32: dst 0x%llx must be a 4-byte aligned, seed 0x%llx and "
                      "offset 0x%llx 8-byte aligned device pointers",
                      (unsigned long long)dst, (unsigned long long)seed_ptr,
                      (unsigned long long)offset_ptr);
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_PHILOX,
                       .dst = dst,
                       .a = seed_ptr,
                       .b = offset_ptr,
                       .count = count,
                       .offset = offset_add};
  return gca__sim_stream_submit("kernel_philox_u32", stream, &w, NULL);
}

/* The compute kernels (Note [Compute order], device.h): arguments checked as
 * on cuda (compute.c), memory when the work runs. */
static gca_status_t sim_kernel_gemm_f32(gca_devptr_t c, gca_devptr_t a, gca_devptr_t b, uint32_t m,
                                        uint32_t n, uint32_t k, uint32_t flags,
                                        gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_gemm_f32, 0);
  gca__compute_span_t span;
  GCA_CHECK(gca__check_gemm_f32(c, a, b, m, n, k, flags, &span));
  gca__sim_work_t w = {
      .kind = GCA__SIM_WORK_GEMM, .dst = c, .a = a, .b = b, .m = m, .n = n, .k = k, .op = flags};
  return gca__sim_stream_submit("kernel_gemm_f32", stream, &w, NULL);
}

static gca_status_t sim_kernel_ew_f32(gca_ew_op_t op, gca_devptr_t dst, gca_devptr_t a,
                                      gca_devptr_t b, float s, uint32_t u, size_t count,
                                      gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_ew_f32, 0);
  gca__compute_span_t span;
  GCA_CHECK(gca__check_ew_f32(op, dst, a, b, count, &span));
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_EW,
                       .dst = dst,
                       .a = a,
                       .b = span.b ? b : 0,
                       .count = count,
                       .op = (uint32_t)op,
                       .scale = s,
                       .value = u};
  return gca__sim_stream_submit("kernel_ew_f32", stream, &w, NULL);
}

static gca_status_t sim_kernel_dot_f32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                       size_t count, float s, gca_stream_t stream) {
  GCA_SIM_ENTER(kernel_dot_f32, 0);
  gca__compute_span_t span;
  GCA_CHECK(gca__check_dot_f32(dst, a, b, count, &span));
  gca__sim_work_t w = {
      .kind = GCA__SIM_WORK_DOT, .dst = dst, .a = a, .b = b, .count = count, .scale = s};
  return gca__sim_stream_submit("kernel_dot_f32", stream, &w, NULL);
}

void gca__sim_work_ops(gca_device_ops_t *ops) {
  ops->launch_host_func = sim_launch_host_func;
  ops->memcpy_async = sim_memcpy_async;
  ops->memset_d8_async = sim_memset_d8_async;
  ops->memset_d32_async = sim_memset_d32_async;
  ops->kernel_fill_u32 = sim_kernel_fill_u32;
  ops->kernel_add_u32 = sim_kernel_add_u32;
  ops->kernel_sleep = sim_kernel_sleep;
  ops->kernel_philox_u32 = sim_kernel_philox_u32;
  ops->kernel_copy_batch = sim_kernel_copy_batch;
  ops->kernel_gemm_f32 = sim_kernel_gemm_f32;
  ops->kernel_ew_f32 = sim_kernel_ew_f32;
  ops->kernel_dot_f32 = sim_kernel_dot_f32;
}
