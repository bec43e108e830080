/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_kernels.c - launches of the kernels embedded as PTX (cuda_ptx.h) on the
 * cuda backend: the ready-made kernels (fill, add, sleep, copy batch, Philox)
 * and the f32 compute kernels (Note [Compute order], device.h).
 *
 * The one idea: the module is loaded once per device on first use, and each
 * launch only picks a grid big enough to be fast (the kernels stride, so any
 * shape is correct) and passes its parameters as the PTX declares them.
 */
#include <stdatomic.h>
#include <pthread.h>

#include "cuda_internal.h"

#ifdef GCA_CUDA_FULL

#include "cuda_ptx.h"

#define KERNEL_BLOCK    256u
#define KERNEL_MAX_GRID 4096u
#define GEMM_TILE       16u

/* ---- kernels ---- */

/* Loads the PTX module into `dev`'s primary context (current on this thread)
 * once. The thread's capture mode is relaxed meanwhile: loading a module is
 * not legal under a global-mode capture, and the first launch may be captured. */
static gca_status_t load_module(const char *op, int dev, gca__cuda_device_t **out) {
  gca__cuda_device_t *d = &gca__cuda_lib.dev[dev];
  *out = d;
  if (GCA_LIKELY(atomic_load_explicit(&d->module, memory_order_acquire) != NULL))
    return GCA_OK;
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&gca__cuda_dev_lock);
  if (atomic_load_explicit(&d->module, memory_order_relaxed) != NULL)
    goto out_unlock;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_CHECK_GOTO(op, gca__cuda_drv.ThreadExchangeStreamCaptureMode(&mode), st, out_unlock);
  CUmodule mod = NULL;
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleLoadData(&mod, gca__cuda_ptx), st, out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_fill, mod, GCA_PTX_FILL_NAME), st,
                out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_add, mod, GCA_PTX_ADD_NAME), st,
                out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_sleep, mod, GCA_PTX_SLEEP_NAME), st,
                out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_philox, mod, GCA_PTX_PHILOX_NAME), st,
                out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_copy, mod, GCA_PTX_COPY_NAME), st,
                out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_gemm, mod, GCA_PTX_GEMM_NAME), st,
                out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_ew, mod, GCA_PTX_EW_NAME), st, out_mode);
  CU_CHECK_GOTO(op, gca__cuda_drv.ModuleGetFunction(&d->fn_dot, mod, GCA_PTX_DOT_NAME), st,
                out_mode);
  atomic_store_explicit(&d->module, mod, memory_order_release);
out_mode:
  /* A module that failed half-way is leaked on purpose: unloading is another
   * unsafe call under capture, and this path means the JIT is broken anyway. */
  gca__cuda_drv.ThreadExchangeStreamCaptureMode(&mode);
out_unlock:
  pthread_mutex_unlock(&gca__cuda_dev_lock);
  return st;
}

static unsigned grid_for(size_t count) {
  size_t blocks = (count + KERNEL_BLOCK - 1) / KERNEL_BLOCK;
  return blocks > KERNEL_MAX_GRID ? KERNEL_MAX_GRID : (unsigned)(blocks ? blocks : 1);
}

static gca_status_t cuda_kernel_fill_u32(gca_devptr_t dst, uint32_t value, uint32_t step,
                                         size_t count, gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  GCA_CHECK(gca__cuda_enter_stream("kernel_fill_u32", stream, &dev));
  GCA_CHECK(load_module("kernel_fill_u32", dev, &d));
  if (count == 0)
    return GCA_OK;
  CUdeviceptr p_dst = (CUdeviceptr)dst;
  uint64_t p_count = count;
  void *args[] = {&p_dst, &value, &step, &p_count};
  CU_CHECK("kernel_fill_u32",
           gca__cuda_drv.LaunchKernel(d->fn_fill, grid_for(count), 1, 1, KERNEL_BLOCK, 1, 1, 0,
                                      stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_add_u32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                        size_t count, gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  GCA_CHECK(gca__cuda_enter_stream("kernel_add_u32", stream, &dev));
  GCA_CHECK(load_module("kernel_add_u32", dev, &d));
  if (count == 0)
    return GCA_OK;
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_a = (CUdeviceptr)a, p_b = (CUdeviceptr)b;
  uint64_t p_count = count;
  void *args[] = {&p_dst, &p_a, &p_b, &p_count};
  CU_CHECK("kernel_add_u32", gca__cuda_drv.LaunchKernel(d->fn_add, grid_for(count), 1, 1,
                                                        KERNEL_BLOCK, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_sleep(uint64_t ns, gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  GCA_CHECK(gca__cuda_enter_stream("kernel_sleep", stream, &dev));
  GCA_CHECK(load_module("kernel_sleep", dev, &d));
  void *args[] = {&ns};
  CU_CHECK("kernel_sleep",
           gca__cuda_drv.LaunchKernel(d->fn_sleep, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

/* The batch's entries over the grid's y (at most 65535 blocks there: the
 * kernel strides), 32 blocks of KERNEL_BLOCK threads over each entry's bytes. */
static gca_status_t cuda_kernel_copy_batch(gca_devptr_t table, size_t n, gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  GCA_CHECK(gca__cuda_enter_stream("kernel_copy_batch", stream, &dev));
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
  CU_CHECK("kernel_copy_batch", gca__cuda_drv.LaunchKernel(d->fn_copy, 32, gy, 1, KERNEL_BLOCK, 1,
                                                           1, 0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_philox_u32(gca_devptr_t dst, size_t count, gca_devptr_t seed_ptr,
                                           gca_devptr_t offset_ptr, uint64_t offset_add,
                                           gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  GCA_CHECK(gca__cuda_enter_stream("kernel_philox_u32", stream, &dev));
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
  CU_CHECK("kernel_philox_u32",
           gca__cuda_drv.LaunchKernel(d->fn_philox, grid_for((count + 3) / 4), 1, 1, KERNEL_BLOCK,
                                      1, 1, 0, stream, args, NULL));
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
  gca__cuda_device_t *d;
  gca__compute_span_t span;
  GCA_CHECK(gca__cuda_enter_stream("kernel_gemm_f32", stream, &dev));
  GCA_CHECK(gca__check_gemm_f32(c, a, b, m, n, k, flags, &span));
  GCA_CHECK(load_module("kernel_gemm_f32", dev, &d));
  if (span.dst == 0)
    return GCA_OK;
  CUdeviceptr p_c = (CUdeviceptr)c, p_a = (CUdeviceptr)a, p_b = (CUdeviceptr)b;
  void *args[] = {&p_c, &p_a, &p_b, &m, &n, &k, &flags};
  CU_CHECK("kernel_gemm_f32",
           gca__cuda_drv.LaunchKernel(d->fn_gemm, gemm_grid(n), gemm_grid(m), 1, GEMM_TILE,
                                      GEMM_TILE, 1, 0, stream, args, NULL));
  return GCA_OK;
}

static gca_status_t cuda_kernel_ew_f32(gca_ew_op_t op, gca_devptr_t dst, gca_devptr_t a,
                                       gca_devptr_t b, float s, uint32_t u, size_t count,
                                       gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  gca__compute_span_t span;
  GCA_CHECK(gca__cuda_enter_stream("kernel_ew_f32", stream, &dev));
  GCA_CHECK(gca__check_ew_f32(op, dst, a, b, count, &span));
  GCA_CHECK(load_module("kernel_ew_f32", dev, &d));
  if (count == 0)
    return GCA_OK;
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_a = (CUdeviceptr)a, p_b = span.b ? (CUdeviceptr)b : 0;
  uint64_t p_count = count;
  uint32_t p_op = (uint32_t)op;
  void *args[] = {&p_dst, &p_a, &p_b, &p_count, &p_op, &s, &u};
  CU_CHECK("kernel_ew_f32", gca__cuda_drv.LaunchKernel(d->fn_ew, grid_for(count), 1, 1,
                                                       KERNEL_BLOCK, 1, 1, 0, stream, args, NULL));
  return GCA_OK;
}

/* One block of GCA__DOT_LANES threads, whatever count is: the lanes fix the
 * order of the sum. */
static gca_status_t cuda_kernel_dot_f32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                        size_t count, float s, gca_stream_t stream) {
  int dev;
  gca__cuda_device_t *d;
  gca__compute_span_t span;
  GCA_CHECK(gca__cuda_enter_stream("kernel_dot_f32", stream, &dev));
  GCA_CHECK(gca__check_dot_f32(dst, a, b, count, &span));
  GCA_CHECK(load_module("kernel_dot_f32", dev, &d));
  CUdeviceptr p_dst = (CUdeviceptr)dst, p_a = (CUdeviceptr)a, p_b = (CUdeviceptr)b;
  uint64_t p_count = count;
  void *args[] = {&p_dst, &p_a, &p_b, &p_count, &s};
  CU_CHECK("kernel_dot_f32", gca__cuda_drv.LaunchKernel(d->fn_dot, 1, 1, 1, GCA__DOT_LANES, 1, 1, 0,
                                                        stream, args, NULL));
  return GCA_OK;
}

void gca__cuda_kernel_ops(gca_device_ops_t *ops) {
  ops->kernel_fill_u32 = cuda_kernel_fill_u32;
  ops->kernel_add_u32 = cuda_kernel_add_u32;
  ops->kernel_sleep = cuda_kernel_sleep;
  ops->kernel_copy_batch = cuda_kernel_copy_batch;
  ops->kernel_philox_u32 = cuda_kernel_philox_u32;
  ops->kernel_gemm_f32 = cuda_kernel_gemm_f32;
  ops->kernel_ew_f32 = cuda_kernel_ew_f32;
  ops->kernel_dot_f32 = cuda_kernel_dot_f32;
}

#endif /* GCA_CUDA_FULL */
