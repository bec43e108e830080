/* SPDX-License-Identifier: Apache-2.0 */
/* preload.c - libgca_preload.so: `LD_PRELOAD=libgca_preload.so ./program`
 * serves an unmodified program's device allocations from gca.
 *
 * The one idea: the shim defines the allocation entry points of the CUDA
 * runtime and driver (cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync,
 * cudaMallocFromPoolAsync, cudaMemGetInfo, cuMemAlloc_v2, cuMemFree_v2,
 * cuMemAllocAsync, cuMemFreeAsync and their per-thread-stream _ptsz forms)
 * ahead of the real libraries in symbol lookup order, and answers them with
 * gca_malloc_device / gca_free; streams pass straight through
 * (cudaStream_t == gca_stream_t). Everything else the program calls reaches
 * the real library: symbols the shim does not define resolve there by
 * themselves, and those it does define forward with dlsym(RTLD_NEXT, ...), or
 * for driver names to the driver library itself (Note [Finding the driver]).
 *
 * On the cuda backend the shim serves nothing but allocation; a free of a
 * pointer outside gca's memory goes to the real cudaFree / cuMemFree, one
 * inside it never does (Note [Refused frees]). On the sim backend there is no
 * real device behind libcudart, so the shim also serves the runtime calls
 * allocation-heavy programs make (device selection, streams, events, copies,
 * memsets, synchronization, errors), keeping a per-thread last error as
 * cudart does; a free of a foreign pointer is cudaErrorInvalidValue and a
 * logged message.
 *
 * Note [Preload initialization]: nothing runs at load time. The first call of
 * any entry point initializes gca under pthread_once (the device backend per
 * GCA_DEVICE; the allocator itself on its first use), so a constructor of
 * another library may allocate before this library's own initializers would
 * have run. GCA_PRINT_STATS=1 prints gca's statistics (and the pinned host
 * allocator's, once used) and runs the allocator's invariant check on stderr
 * at exit; GCA_TRACE records the allocation trace as the allocator always does.
 *
 * Pinned host memory is served on both backends by gca's caching host
 * allocator (gca/host.h): cudaHostAlloc, cudaMallocHost, cudaFreeHost,
 * cuMemHostAlloc, cuMemAllocHost_v2, cuMemFreeHost, and cudaHostRegister /
 * cudaHostUnregister through gca_host_register. Flags are not needed: every
 * pinned block is portable and mapped as the driver's defaults on unified
 * addressing make it. A cudaFreeHost of memory gca did not pin goes to the
 * real library on cuda and is refused on sim; one inside gca's pinned arena
 * is refused on both. The shim lists libjemalloc.so.2 as a dependency, so
 * jemalloc is loaded at program start (where its static TLS fits) and after
 * libc in the search order: the program's malloc stays glibc's (Note [Loading
 * jemalloc], allocator/host_je.c).
 *
 * cudaFree is stream-ordered on the legacy stream, as every caching
 * allocator's free is: it does not wait for the device as the real cudaFree
 * does; a block freed by cudaFreeAsync on a stream other than its allocation
 * stream is reused only after that stream's work queued before the free.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common.h"
#include "device.h"
#include "gca.h"
#include "introspect.h"
#include "shim.h"

/* Per-thread-default-stream forms (programs built with --default-stream
 * per-thread); the headers declare them only under that option. */
SHIM_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
SHIM_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
SHIM_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                  cudaStream_t stream);
SHIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
SHIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* ---- state ---- */

/* X(name): counted entry points, printed by GCA_PRINT_STATS. */
#define SHIM_CALL_MAP(X) \
  X(cudaMalloc)          \
  X(cudaMallocAsync)     \
  X(cudaFree)            \
  X(cudaFreeAsync)       \
  X(cuMemAlloc)          \
  X(cuMemAllocAsync)     \
  X(cuMemFree)           \
  X(cuMemFreeAsync)      \
  X(cudaHostAlloc)       \
  X(cudaFreeHost)        \
  X(cudaHostRegister)    \
  X(cuMemHostAlloc)      \
  X(cuMemFreeHost)       \
  X(cudaStreamDestroy)   \
  X(cuStreamDestroy)     \
  X(foreign_free)        \
  X(failed_alloc)

enum {
#define SHIM_CALL_ENUM(name) CALL_##name,
  SHIM_CALL_MAP(SHIM_CALL_ENUM)
#undef SHIM_CALL_ENUM
      CALL_COUNT
};

static const char *const call_names[CALL_COUNT] = {
#define SHIM_CALL_NAME(name) #name,
    SHIM_CALL_MAP(SHIM_CALL_NAME)
#undef SHIM_CALL_NAME
};

/* Invariant: written once under init_once; read-only afterwards. on_sim is
 * true iff gca initialized with the sim backend. */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static gca_status_t init_status;
static char init_detail[512];
static bool on_sim;
static _Atomic int64_t call_counts[CALL_COUNT];
static atomic_bool counting = true; /* until initialization reads GCA_PRINT_STATS */

/* The last error of the calling thread's served runtime calls, as cudart's
 * cudaGetLastError / cudaPeekAtLastError report it. */
static __thread cudaError_t last_error = cudaSuccess;

/* Calls are counted only when GCA_PRINT_STATS asked for them, so the hot path
 * pays no shared atomic otherwise. */
static inline void count_call(int which) {
  if (GCA_UNLIKELY(atomic_load_explicit(&counting, memory_order_relaxed)))
    atomic_fetch_add_explicit(&call_counts[which], 1, memory_order_relaxed);
}

/* ---- statistics at exit ---- */

static void print_stats(void) {
  char a[32], b[32], c[32];
  fprintf(stderr, "gca-preload: calls:");
  for (int i = 0; i < CALL_COUNT; i++)
    fprintf(stderr, "%s %s %" PRId64, i ? "," : "", call_names[i],
            atomic_load_explicit(&call_counts[i], memory_order_relaxed));
  fprintf(stderr, "\n");
  int ndev = gca__allocator_device_count();
  for (int dev = 0; dev < ndev; dev++) {
    gca_stats_t s;
    if (gca_get_stats(dev, &s) != GCA_OK) {
      fprintf(stderr, "gca-preload: device %d: statistics unavailable: %s\n", dev,
              gca_last_error());
      continue;
    }
    int64_t allocs = s.allocation[GCA_STAT_ALL].allocated;
    int64_t hits = allocs > s.num_device_alloc ? allocs - s.num_device_alloc : 0;
    fprintf(stderr,
            "gca-preload: device %d (%s): allocations %" PRId64 ", frees %" PRId64 ", live %" PRId64
            ", device allocs %" PRId64 ", device frees %" PRId64 ", cached hits %" PRId64
            ", peak allocated %s, peak reserved %s, reserved %s, "
            "alloc retries %" PRId64 ", ooms %" PRId64 "\n",
            dev, gca_device_backend_name(), allocs, s.allocation[GCA_STAT_ALL].freed,
            s.allocation[GCA_STAT_ALL].current, s.num_device_alloc, s.num_device_free, hits,
            gca__format_size((uint64_t)s.allocated_bytes[GCA_STAT_ALL].peak, a, sizeof(a)),
            gca__format_size((uint64_t)s.reserved_bytes[GCA_STAT_ALL].peak, b, sizeof(b)),
            gca__format_size((uint64_t)s.reserved_bytes[GCA_STAT_ALL].current, c, sizeof(c)),
            s.num_alloc_retries, s.num_ooms);
  }
  int64_t host_calls =
      atomic_load_explicit(&call_counts[CALL_cudaHostAlloc], memory_order_relaxed) +
      atomic_load_explicit(&call_counts[CALL_cuMemHostAlloc], memory_order_relaxed);
  gca_host_stats_t h;
  if (host_calls > 0 && gca_host_get_stats(&h) == GCA_OK)
    fprintf(stderr,
            "gca-preload: pinned host: allocations %" PRId64 ", frees %" PRId64 ", live %" PRId64
            ", pending frees %" PRId64 ", reserved %s\n",
            h.allocation.allocated, h.allocation.freed, h.allocation.current, h.pending_frees,
            gca__format_size((uint64_t)h.reserved_bytes.current, a, sizeof(a)));
  gca_status_t st = gca_allocator_check();
  fprintf(stderr, "gca-preload: allocator check: %s\n", st == GCA_OK ? "ok" : gca_last_error());
}

/* ---- initialization (Note [Preload initialization]) ---- */

static void init_shim(void) {
  init_status = gca_device_init();
  if (init_status != GCA_OK) {
    snprintf(init_detail, sizeof(init_detail), "%s", gca_last_error());
    GCA_LOG_ERR("libgca_preload: gca could not initialize a device backend: %s", init_detail);
  } else {
    const char *name = gca_device_backend_name();
    on_sim = name && strcmp(name, "sim") == 0;
  }
  bool stats = false;
  const char *v = gca__getenv("GCA_PRINT_STATS");
  if (v && *v && gca__parse_bool(v, &stats) != GCA_OK)
    GCA_LOG_WARN("libgca_preload: ignoring GCA_PRINT_STATS: %s", gca_last_error());
  if (stats)
    atexit(print_stats);
  else
    atomic_store_explicit(&counting, false, memory_order_relaxed);
}

/* GCA_OK once gca has a device backend; else the initialization's status with
 * its detail set on the calling thread. */
static gca_status_t shim_ready(void) {
  pthread_once(&init_once, init_shim);
  if (GCA_UNLIKELY(init_status != GCA_OK))
    return gca__error(init_status, "%s", init_detail);
  return GCA_OK;
}

/* True when the shim serves the runtime itself (sim backend). */
static bool shim_on_sim(void) {
  return shim_ready() == GCA_OK && on_sim;
}

bool gca__shim_on_sim(void) {
  return shim_on_sim();
}

/* ---- the real libraries ---- */

/* Note [Finding the driver]: the runtime's entry points (cuda*) follow the
 * shim in the global lookup scope, since the program links libcudart, so
 * dlsym(RTLD_NEXT) finds them. The driver's (cu*) usually do not: libcudart
 * dlopen()s libcuda.so.1 RTLD_LOCAL, and unless the program links libcuda
 * itself RTLD_NEXT finds nothing. A driver name RTLD_NEXT misses is looked up
 * in the driver library itself: libcuda.so.1 when the process has loaded it
 * (the program's runtime uses that one), else the library gca's cuda backend
 * loaded (GCA_CUDA_LIBRARY), else libcuda.so.1 loaded now. A lookup through a
 * library's handle searches that library and its dependencies only, so it
 * never finds the shim's own definition. */

#define DRIVER_SONAME "libcuda.so.1"

/* libcuda.so.1's handle once one was had (kept open for the process). */
static void *_Atomic driver_lib;

static bool is_driver_name(const char *name) {
  return strncmp(name, "cu", 2) == 0 && strncmp(name, "cuda", 4) != 0;
}

/* Stores h as driver_lib unless another thread stored one first; returns the
 * one stored. */
static void *keep_driver_lib(void *h) {
  void *had = NULL;
  if (atomic_compare_exchange_strong(&driver_lib, &had, h))
    return h;
  dlclose(h);
  return had;
}

/* `name` in the driver library (Note [Finding the driver]); NULL if none has it. */
static void *driver_symbol(const char *name) {
  void *h = atomic_load_explicit(&driver_lib, memory_order_acquire);
  if (h == NULL) {
    h = dlopen(DRIVER_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h != NULL)
      h = keep_driver_lib(h);
  }
  void *f = h != NULL ? dlsym(h, name) : NULL;
  if (f == NULL)
    f = gca__cuda_driver_symbol(name);
  if (f == NULL && h == NULL) {
    h = dlopen(DRIVER_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h != NULL)
      f = dlsym(keep_driver_lib(h), name);
  }
  return f;
}

void *gca__shim_real(const char *name, void **slot) {
  void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (GCA_LIKELY(f != NULL))
    return f;
  bool driver = is_driver_name(name);
  f = dlsym(RTLD_NEXT, name);
  if (f == NULL && driver)
    f = driver_symbol(name);
  if (f)
    __atomic_store_n(slot, f, __ATOMIC_RELEASE);
  else
    GCA_LOG_ERR("%s: no definition after libgca_preload.so%s to forward to (is the CUDA library "
                "loaded?)",
                name, driver ? " nor in the CUDA driver library" : "");
  return f;
}

/* Returns the real runtime function's result, or cudaErrorNotSupported (last
 * error set) when there is none. */
#define FORWARD_RT(fn, ...)                      \
  do {                                           \
    __typeof__(&fn) real_ = REAL(fn);            \
    if (!real_)                                  \
      return last_error = cudaErrorNotSupported; \
    return real_(__VA_ARGS__);                   \
  } while (0)

#define FORWARD_DRV(fn, ...)           \
  do {                                 \
    __typeof__(&fn) real_ = REAL(fn);  \
    if (!real_)                        \
      return CUDA_ERROR_NOT_SUPPORTED; \
    return real_(__VA_ARGS__);         \
  } while (0)

/* ---- status mapping ---- */

static cudaError_t to_cuda_error(gca_status_t st) {
  switch (st) {
  case GCA_OK:
    return cudaSuccess;
  case GCA_ERR_INVALID_ARGUMENT:
    return cudaErrorInvalidValue;
  case GCA_ERR_INVALID_POINTER:
    return cudaErrorInvalidValue;
  case GCA_ERR_OUT_OF_MEMORY:
    return cudaErrorMemoryAllocation;
  case GCA_ERR_NO_DEVICE:
    return cudaErrorNoDevice;
  case GCA_ERR_NOT_SUPPORTED:
    return cudaErrorNotSupported;
  case GCA_ERR_NOT_READY:
    return cudaErrorNotReady;
  case GCA_ERR_INVALID_HANDLE:
    return cudaErrorInvalidResourceHandle;
  case GCA_ERR_INVALID_STATE:
    return cudaErrorIllegalState;
  case GCA_ERR_CAPTURE_UNSUPPORTED:
    return cudaErrorStreamCaptureUnsupported;
  case GCA_ERR_CAPTURE_INVALIDATED:
    return cudaErrorStreamCaptureInvalidated;
  case GCA_ERR_CAPTURE_IMPLICIT:
    return cudaErrorStreamCaptureImplicit;
  case GCA_ERR_CAPTURE_UNMATCHED:
    return cudaErrorStreamCaptureUnmatched;
  case GCA_ERR_CAPTURE_WRONG_THREAD:
    return cudaErrorStreamCaptureWrongThread;
  case GCA_ERR_CAPTURE_UNJOINED:
    return cudaErrorStreamCaptureUnjoined;
  case GCA_ERR_GRAPH_UPDATE:
    return cudaErrorGraphExecUpdateFailure;
  case GCA_ERR_CONFIG:
    return cudaErrorInitializationError;
  default:
    return cudaErrorUnknown;
  }
}

static CUresult to_cu_result(gca_status_t st) {
  switch (st) {
  case GCA_OK:
    return CUDA_SUCCESS;
  case GCA_ERR_INVALID_ARGUMENT:
    return CUDA_ERROR_INVALID_VALUE;
  case GCA_ERR_INVALID_POINTER:
    return CUDA_ERROR_INVALID_VALUE;
  case GCA_ERR_OUT_OF_MEMORY:
    return CUDA_ERROR_OUT_OF_MEMORY;
  case GCA_ERR_NO_DEVICE:
    return CUDA_ERROR_NO_DEVICE;
  case GCA_ERR_NOT_SUPPORTED:
    return CUDA_ERROR_NOT_SUPPORTED;
  case GCA_ERR_NOT_READY:
    return CUDA_ERROR_NOT_READY;
  case GCA_ERR_INVALID_HANDLE:
    return CUDA_ERROR_INVALID_HANDLE;
  case GCA_ERR_INVALID_STATE:
    return CUDA_ERROR_ILLEGAL_STATE;
  case GCA_ERR_CAPTURE_UNSUPPORTED:
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  case GCA_ERR_CAPTURE_INVALIDATED:
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  case GCA_ERR_CAPTURE_IMPLICIT:
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  case GCA_ERR_CAPTURE_UNMATCHED:
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  case GCA_ERR_CAPTURE_WRONG_THREAD:
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  case GCA_ERR_CAPTURE_UNJOINED:
    return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  case GCA_ERR_GRAPH_UPDATE:
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  case GCA_ERR_CONFIG:
    return CUDA_ERROR_NOT_INITIALIZED;
  default:
    return CUDA_ERROR_UNKNOWN;
  }
}

/* Records a runtime result as the thread's last error (cudaErrorNotReady is a
 * state, not an error, as in cudart) and returns it. */
static inline cudaError_t rt_result(cudaError_t e) {
  if (GCA_UNLIKELY(e != cudaSuccess && e != cudaErrorNotReady))
    last_error = e;
  return e;
}

cudaError_t gca__shim_rt_error(cudaError_t e) {
  return rt_result(e);
}

static inline cudaError_t rt_status(gca_status_t st) {
  if (GCA_LIKELY(st == GCA_OK))
    return cudaSuccess;
  if (st != GCA_ERR_NOT_READY)
    GCA_LOG_INFO("%s", gca_last_error());
  return rt_result(to_cuda_error(st));
}

static inline CUresult drv_status(gca_status_t st) {
  if (GCA_LIKELY(st == GCA_OK))
    return CUDA_SUCCESS;
  if (st != GCA_ERR_NOT_READY)
    GCA_LOG_INFO("%s", gca_last_error());
  return to_cu_result(st);
}

/* ---- devices and streams ---- */

enum api_kind { API_RUNTIME, API_DRIVER };

/* The calling thread's current device as the program's API sees it: gca's on
 * sim; on cuda the runtime's (cudaGetDevice) or the current context's. */
static gca_status_t current_device(enum api_kind api, int *dev) {
  if (on_sim)
    return gca_get_device(dev);
  if (api == API_RUNTIME) {
    __typeof__(&cudaGetDevice) get = REAL(cudaGetDevice);
    if (get) {
      cudaError_t e = get(dev);
      if (e != cudaSuccess)
        return gca__error(GCA_ERR_NO_DEVICE, "cudaGetDevice: the CUDA runtime returned error %d",
                          (int)e);
      return GCA_OK;
    }
  } else {
    __typeof__(&cuCtxGetDevice) get = REAL(cuCtxGetDevice);
    CUdevice d = 0;
    if (get && get(&d) == CUDA_SUCCESS) {
      *dev = (int)d;
      return GCA_OK;
    }
  }
  return gca_get_device(dev);
}

/* The gca stream behind a program's stream handle. The special handles
 * cudaStreamLegacy and cudaStreamPerThread have the driver's values, which
 * the device layer accepts on both backends (Note [Special streams]); a NULL
 * stream in a _ptsz entry point is the per-thread stream. */
static inline gca_stream_t gca_stream_of(cudaStream_t s, bool per_thread) {
  if (per_thread && s == NULL)
    return cudaStreamPerThread;
  return s;
}

/* ---- allocation ---- */

/* Allocates through gca on the caller's current device. */
static gca_status_t shim_malloc(const char *api, enum api_kind kind, void **ptr, size_t size,
                                cudaStream_t stream, bool per_thread) {
  if (GCA_UNLIKELY(ptr == NULL))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: the result pointer is NULL", api);
  GCA_CHECK(shim_ready());
  int dev = 0;
  GCA_CHECK(current_device(kind, &dev));
  gca_status_t st = gca_malloc_device(dev, ptr, size, gca_stream_of(stream, per_thread));
  if (GCA_UNLIKELY(st != GCA_OK)) {
    count_call(CALL_failed_alloc);
    return gca__error_prefix(st, "%s(%zu bytes, device %d)", api, size, dev);
  }
  return GCA_OK;
}

/* Frees through gca; GCA_ERR_INVALID_POINTER (nothing changed) when gca does
 * not own `ptr`. A free on a stream other than the allocation's is ordered
 * after that stream's queued work. */
static gca_status_t shim_free(void *ptr, cudaStream_t stream, bool async, bool per_thread) {
  GCA_CHECK(shim_ready());
  if (async)
    GCA_CHECK(gca_record_stream(ptr, gca_stream_of(stream, per_thread)));
  return gca_free(ptr);
}

/* Note [Refused frees]: a free gca refuses (GCA_ERR_INVALID_POINTER: not the
 * start of a live gca allocation) goes on to the CUDA library only on the cuda
 * backend and only for a pointer outside all memory gca holds: its device
 * segments (cached or live, any pool, classic or expandable) and its pinned
 * host arena. A double free or an interior pointer of gca's memory may be the
 * very address of a segment gca got from cuMemAlloc, or lie inside one it
 * mapped or pinned, and the real cudaFree / cuMemFree / cudaFreeHost would
 * free that memory under gca's cache. Everything not forwarded is refused as
 * on sim: cudaErrorInvalidValue (the thread's last error) or
 * CUDA_ERROR_INVALID_VALUE, and a logged message naming the pointer. */

/* For a free gca refused, its detail set: true when the free goes on to the
 * CUDA library; else *st is the refusal's status, logged, with gca's own
 * detail (foreign, interior or double free). */
static bool refused_goes_on(const char *api, const void *ptr, gca_status_t *st) {
  int dev = -1;
  bool device = false;
  if (!on_sim) {
    device = gca__allocator_owns((gca_devptr_t)(uintptr_t)ptr, &dev);
    if (!device && !gca__host_owns(ptr))
      return true;
  }
  count_call(CALL_foreign_free);
  char why[256], where[32];
  snprintf(why, sizeof(why), "%s", gca_last_error());
  if (on_sim) {
    *st = gca__error(GCA_ERR_INVALID_POINTER,
                     "%s: %p is not a live gca allocation and the sim backend has no other "
                     "allocator to hand it to (%s)",
                     api, ptr, why);
  } else {
    if (device)
      snprintf(where, sizeof(where), "device %d", dev);
    else
      snprintf(where, sizeof(where), "pinned host");
    *st = gca__error(GCA_ERR_INVALID_POINTER,
                     "%s: %p lies inside gca's memory (%s) but is not a live allocation's "
                     "start: freed already, or inside an allocation; not handed to the CUDA "
                     "library, which would free gca's memory under it (%s)",
                     api, ptr, where, why);
  }
  GCA_LOG_ERR("%s", gca_last_error());
  return false;
}

static cudaError_t rt_malloc_async(const char *api, void **ptr, size_t size, cudaStream_t s,
                                   bool per_thread) {
  count_call(CALL_cudaMallocAsync);
  return rt_status(shim_malloc(api, API_RUNTIME, ptr, size, s, per_thread));
}

static cudaError_t rt_free_async(void *ptr, cudaStream_t s, bool per_thread) {
  count_call(CALL_cudaFreeAsync);
  if (ptr == NULL)
    return cudaSuccess;
  gca_status_t st = shim_free(ptr, s, true, per_thread);
  if (st == GCA_ERR_INVALID_POINTER &&
      refused_goes_on(per_thread ? "cudaFreeAsync_ptsz" : "cudaFreeAsync", ptr, &st)) {
    if (per_thread)
      FORWARD_RT(cudaFreeAsync_ptsz, ptr, s);
    FORWARD_RT(cudaFreeAsync, ptr, s);
  }
  return rt_status(st);
}

SHIM_API cudaError_t cudaMalloc(void **devPtr, size_t size) {
  count_call(CALL_cudaMalloc);
  return rt_status(shim_malloc("cudaMalloc", API_RUNTIME, devPtr, size, NULL, false));
}

SHIM_API cudaError_t cudaFree(void *devPtr) {
  count_call(CALL_cudaFree);
  if (devPtr == NULL) {
    /* cudaFree(0) is the idiom that creates the runtime's context. */
    if (shim_ready() == GCA_OK && !on_sim)
      FORWARD_RT(cudaFree, devPtr);
    return cudaSuccess;
  }
  gca_status_t st = shim_free(devPtr, NULL, false, false);
  if (st == GCA_ERR_INVALID_POINTER && refused_goes_on("cudaFree", devPtr, &st))
    FORWARD_RT(cudaFree, devPtr);
  return rt_status(st);
}

SHIM_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  return rt_malloc_async("cudaMallocAsync", devPtr, size, hStream, false);
}

SHIM_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
  return rt_malloc_async("cudaMallocAsync_ptsz", devPtr, size, hStream, true);
}

SHIM_API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                             cudaStream_t stream) {
  return rt_malloc_async("cudaMallocFromPoolAsync", ptr, size, stream, false);
}

SHIM_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                  cudaStream_t stream) {
  return rt_malloc_async("cudaMallocFromPoolAsync_ptsz", ptr, size, stream, true);
}

SHIM_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  return rt_free_async(devPtr, hStream, false);
}

SHIM_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) {
  return rt_free_async(devPtr, hStream, true);
}

/* ---- pinned host memory ---- */

static gca_status_t shim_host_alloc(const char *api, void **p, size_t size) {
  if (p == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: the pointer's address is NULL", api);
  GCA_CHECK(shim_ready());
  gca_status_t st = gca_host_alloc(p, size);
  return st == GCA_OK ? GCA_OK : gca__error_prefix(st, "%s", api);
}

SHIM_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  count_call(CALL_cudaHostAlloc);
  return rt_status(shim_host_alloc("cudaHostAlloc", pHost, size));
}

SHIM_API cudaError_t cudaMallocHost(void **ptr, size_t size) {
  count_call(CALL_cudaHostAlloc);
  return rt_status(shim_host_alloc("cudaMallocHost", ptr, size));
}

SHIM_API cudaError_t cudaFreeHost(void *ptr) {
  count_call(CALL_cudaFreeHost);
  gca_status_t st = shim_ready();
  if (st == GCA_OK)
    st = gca_host_free(ptr);
  if (st == GCA_ERR_INVALID_POINTER && refused_goes_on("cudaFreeHost", ptr, &st))
    FORWARD_RT(cudaFreeHost, ptr);
  return rt_status(st);
}

SHIM_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  count_call(CALL_cudaHostRegister);
  gca_status_t st = shim_ready();
  return rt_status(st == GCA_OK ? gca_host_register(ptr, size) : st);
}

SHIM_API cudaError_t cudaHostUnregister(void *ptr) {
  gca_status_t st = shim_ready();
  return rt_status(st == GCA_OK ? gca_host_unregister(ptr) : st);
}

SHIM_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  count_call(CALL_cuMemHostAlloc);
  return drv_status(shim_host_alloc("cuMemHostAlloc", pp, bytesize));
}

SHIM_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
  count_call(CALL_cuMemHostAlloc);
  return drv_status(shim_host_alloc("cuMemAllocHost_v2", pp, bytesize));
}

SHIM_API CUresult cuMemFreeHost(void *p) {
  count_call(CALL_cuMemFreeHost);
  gca_status_t st = shim_ready();
  if (st == GCA_OK)
    st = gca_host_free(p);
  if (st == GCA_ERR_INVALID_POINTER && refused_goes_on("cuMemFreeHost", p, &st))
    FORWARD_DRV(cuMemFreeHost, p);
  return drv_status(st);
}

/* free = the device's free memory + what gca holds cached and unused. */
static gca_status_t shim_mem_info(enum api_kind kind, size_t *free_b, size_t *total_b) {
  if (free_b == NULL || total_b == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "cudaMemGetInfo: free or total is NULL");
  GCA_CHECK(shim_ready());
  int dev = 0;
  GCA_CHECK(current_device(kind, &dev));
  size_t f = 0, t = 0;
  GCA_CHECK(gca__device()->mem_get_info(dev, &f, &t));
  gca_stats_t s;
  GCA_CHECK(gca_get_stats(dev, &s));
  int64_t cached = s.reserved_bytes[GCA_STAT_ALL].current - s.allocated_bytes[GCA_STAT_ALL].current;
  *free_b = f + (cached > 0 ? (size_t)cached : 0);
  *total_b = t;
  return GCA_OK;
}

SHIM_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  return rt_status(shim_mem_info(API_RUNTIME, free, total));
}

/* ---- driver API allocation ---- */

static CUresult drv_alloc(const char *api, CUdeviceptr *dptr, size_t bytesize, CUstream s,
                          bool per_thread) {
  if (dptr == NULL || bytesize == 0)
    return drv_status(gca__error(GCA_ERR_INVALID_ARGUMENT,
                                 "%s: dptr is NULL or bytesize is 0 (bytesize %zu)", api,
                                 bytesize));
  void *p = NULL;
  gca_status_t st = shim_malloc(api, API_DRIVER, &p, bytesize, s, per_thread);
  if (st == GCA_OK)
    *dptr = (CUdeviceptr)(uintptr_t)p;
  return drv_status(st);
}

static CUresult drv_free(const char *api, CUdeviceptr dptr, CUstream s, bool async,
                         bool per_thread) {
  void *p = (void *)(uintptr_t)dptr;
  if (p == NULL) {
    if (shim_ready() == GCA_OK && !on_sim) {
      if (async)
        FORWARD_DRV(cuMemFreeAsync, dptr, s);
      FORWARD_DRV(cuMemFree_v2, dptr);
    }
    return CUDA_ERROR_INVALID_VALUE;
  }
  gca_status_t st = shim_free(p, s, async, per_thread);
  if (st == GCA_ERR_INVALID_POINTER && refused_goes_on(api, p, &st)) {
    if (async && per_thread)
      FORWARD_DRV(cuMemFreeAsync_ptsz, dptr, s);
    if (async)
      FORWARD_DRV(cuMemFreeAsync, dptr, s);
    FORWARD_DRV(cuMemFree_v2, dptr);
  }
  return drv_status(st);
}

SHIM_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  count_call(CALL_cuMemAlloc);
  return drv_alloc("cuMemAlloc_v2", dptr, bytesize, NULL, false);
}

SHIM_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  count_call(CALL_cuMemFree);
  return drv_free("cuMemFree_v2", dptr, NULL, false, false);
}

SHIM_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  count_call(CALL_cuMemAllocAsync);
  return drv_alloc("cuMemAllocAsync", dptr, bytesize, hStream, false);
}

SHIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  count_call(CALL_cuMemAllocAsync);
  return drv_alloc("cuMemAllocAsync_ptsz", dptr, bytesize, hStream, true);
}

SHIM_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  count_call(CALL_cuMemFreeAsync);
  return drv_free("cuMemFreeAsync", dptr, hStream, true, false);
}

SHIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  count_call(CALL_cuMemFreeAsync);
  return drv_free("cuMemFreeAsync_ptsz", dptr, hStream, true, true);
}

/* ---- the runtime served on sim (forwarded on cuda) ---- */

static const gca_device_ops_t *dev_ops(void) {
  return gca__device();
}

static gca_status_t sim_current(int *dev) {
  return gca_get_device(dev);
}

SHIM_API cudaError_t cudaGetDeviceCount(int *count) {
  if (!shim_on_sim())
    FORWARD_RT(cudaGetDeviceCount, count);
  if (count == NULL)
    return rt_status(gca__error(GCA_ERR_INVALID_ARGUMENT, "cudaGetDeviceCount: count is NULL"));
  return rt_status(gca_device_count(count));
}

SHIM_API cudaError_t cudaGetDevice(int *device) {
  if (!shim_on_sim())
    FORWARD_RT(cudaGetDevice, device);
  if (device == NULL)
    return rt_status(gca__error(GCA_ERR_INVALID_ARGUMENT, "cudaGetDevice: device is NULL"));
  return rt_status(gca_get_device(device));
}

SHIM_API cudaError_t cudaSetDevice(int device) {
  if (!shim_on_sim())
    FORWARD_RT(cudaSetDevice, device);
  int n = 0;
  gca_status_t st = gca_device_count(&n);
  if (st != GCA_OK)
    return rt_status(st);
  if (device < 0 || device >= n) {
    GCA_LOG_INFO("cudaSetDevice: device %d is not in [0, %d)", device, n);
    return rt_result(cudaErrorInvalidDevice);
  }
  return rt_status(gca_set_device(device));
}

static gca_status_t sim_stream_create(const char *api, cudaStream_t *out, unsigned flags,
                                      int priority) {
  if (out == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: pStream is NULL", api);
  if (flags & ~(unsigned)cudaStreamNonBlocking)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: flags 0x%x (expected 0 or 0x%x)", api, flags,
                      (unsigned)cudaStreamNonBlocking);
  int dev = 0;
  GCA_CHECK(sim_current(&dev));
  return dev_ops()->stream_create(dev, flags, priority, out);
}

SHIM_API cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  if (!shim_on_sim())
    FORWARD_RT(cudaStreamCreate, pStream);
  return rt_status(sim_stream_create("cudaStreamCreate", pStream, cudaStreamDefault, 0));
}

SHIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  if (!shim_on_sim())
    FORWARD_RT(cudaStreamCreateWithFlags, pStream, flags);
  return rt_status(sim_stream_create("cudaStreamCreateWithFlags", pStream, flags, 0));
}

SHIM_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                  int priority) {
  if (!shim_on_sim())
    FORWARD_RT(cudaStreamCreateWithPriority, pStream, flags, priority);
  return rt_status(sim_stream_create("cudaStreamCreateWithPriority", pStream, flags, priority));
}

/* Note [Destroyed streams] (allocator/streamkey.c): gca keeps stream handles
 * of the memory allocated and recorded on them, and the driver may crash on
 * a destroyed one, so a stream the program destroys is retired in the
 * allocator first, on both backends. The sim's stream destroy, served here: */
static gca_status_t sim_stream_destroy(const char *api, cudaStream_t stream) {
  if (gca_stream_of(stream, false) == NULL)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: %p is a default stream, not a created one", api,
                      (void *)stream);
  return gca__stream_destroy_retired(dev_ops(), stream);
}

SHIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  count_call(CALL_cudaStreamDestroy);
  if (!shim_on_sim()) {
    gca__stream_retire(stream);
    gca__shim_capture_forget(stream); /* Note [Captures under the shim] (capture.c) */
    FORWARD_RT(cudaStreamDestroy, stream);
  }
  return rt_status(sim_stream_destroy("cudaStreamDestroy", stream));
}

/* The driver's cuStreamDestroy (cuda.h names it cuStreamDestroy_v2). */
SHIM_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  count_call(CALL_cuStreamDestroy);
  if (!shim_on_sim()) {
    gca__stream_retire(hStream);
    gca__shim_capture_forget(hStream);
    FORWARD_DRV(cuStreamDestroy_v2, hStream);
  }
  return drv_status(sim_stream_destroy("cuStreamDestroy_v2", hStream));
}

SHIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!shim_on_sim())
    FORWARD_RT(cudaStreamSynchronize, stream);
  return rt_status(dev_ops()->stream_synchronize(gca_stream_of(stream, false)));
}

SHIM_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!shim_on_sim())
    FORWARD_RT(cudaStreamQuery, stream);
  return rt_status(dev_ops()->stream_query(gca_stream_of(stream, false)));
}

SHIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                         unsigned int flags) {
  if (!shim_on_sim())
    FORWARD_RT(cudaStreamWaitEvent, stream, event, flags);
  return rt_status(dev_ops()->stream_wait_event(gca_stream_of(stream, false), event));
}

static gca_status_t sim_event_create(const char *api, cudaEvent_t *out, unsigned flags) {
  if (out == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: event is NULL", api);
  if (flags & cudaEventInterprocess)
    return gca__error(GCA_ERR_NOT_SUPPORTED, "%s: interprocess events are not simulated", api);
  unsigned known = cudaEventBlockingSync | cudaEventDisableTiming;
  if (flags & ~known)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", api, flags & ~known);
  int dev = 0;
  GCA_CHECK(sim_current(&dev));
  unsigned f = ((flags & cudaEventBlockingSync) ? GCA_EVENT_BLOCKING_SYNC : 0) |
               ((flags & cudaEventDisableTiming) ? GCA_EVENT_DISABLE_TIMING : 0);
  return dev_ops()->event_create(dev, f, out);
}

SHIM_API cudaError_t cudaEventCreate(cudaEvent_t *event) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventCreate, event);
  return rt_status(sim_event_create("cudaEventCreate", event, cudaEventDefault));
}

SHIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventCreateWithFlags, event, flags);
  return rt_status(sim_event_create("cudaEventCreateWithFlags", event, flags));
}

SHIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventRecord, event, stream);
  return rt_status(dev_ops()->event_record(event, gca_stream_of(stream, false)));
}

SHIM_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventQuery, event);
  return rt_status(dev_ops()->event_query(event));
}

SHIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventSynchronize, event);
  return rt_status(dev_ops()->event_synchronize(event));
}

SHIM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventDestroy, event);
  return rt_status(dev_ops()->event_destroy(event));
}

SHIM_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!shim_on_sim())
    FORWARD_RT(cudaEventElapsedTime, ms, start, end);
  if (ms == NULL)
    return rt_status(gca__error(GCA_ERR_INVALID_ARGUMENT, "cudaEventElapsedTime: ms is NULL"));
  return rt_status(dev_ops()->event_elapsed(start, end, ms));
}

static gca_status_t sim_memcpy(const char *api, void *dst, const void *src, size_t count,
                               enum cudaMemcpyKind kind, gca_stream_t stream, bool sync) {
  if ((unsigned)kind > (unsigned)cudaMemcpyDefault)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: copy kind %d is not a cudaMemcpyKind", api,
                      (int)kind);
  if (count == 0)
    return GCA_OK;
  if (dst == NULL || src == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: dst %p or src %p is NULL (%zu bytes)", api,
                      dst, src, count);
  GCA_CHECK(dev_ops()->memcpy_async((gca_devptr_t)(uintptr_t)dst, (gca_devptr_t)(uintptr_t)src,
                                    count, stream));
  return sync ? dev_ops()->stream_synchronize(stream) : GCA_OK;
}

SHIM_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                                enum cudaMemcpyKind kind) {
  if (!shim_on_sim())
    FORWARD_RT(cudaMemcpy, dst, src, count, kind);
  gca_status_t st = sim_memcpy("cudaMemcpy", dst, src, count, kind, NULL, true);
  if (st == GCA_ERR_INVALID_ARGUMENT && (unsigned)kind > (unsigned)cudaMemcpyDefault)
    return rt_result(cudaErrorInvalidMemcpyDirection);
  return rt_status(st);
}

SHIM_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                     enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (!shim_on_sim())
    FORWARD_RT(cudaMemcpyAsync, dst, src, count, kind, stream);
  gca_status_t st =
      sim_memcpy("cudaMemcpyAsync", dst, src, count, kind, gca_stream_of(stream, false), false);
  if (st == GCA_ERR_INVALID_ARGUMENT && (unsigned)kind > (unsigned)cudaMemcpyDefault)
    return rt_result(cudaErrorInvalidMemcpyDirection);
  return rt_status(st);
}

static gca_status_t sim_memset(const char *api, void *ptr, int value, size_t count,
                               gca_stream_t stream) {
  if (count == 0)
    return GCA_OK;
  if (ptr == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: devPtr is NULL (%zu bytes)", api, count);
  return dev_ops()->memset_d8_async((gca_devptr_t)(uintptr_t)ptr, (uint8_t)value, count, stream);
}

SHIM_API cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  if (!shim_on_sim())
    FORWARD_RT(cudaMemset, devPtr, value, count);
  return rt_status(sim_memset("cudaMemset", devPtr, value, count, NULL));
}

SHIM_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  if (!shim_on_sim())
    FORWARD_RT(cudaMemsetAsync, devPtr, value, count, stream);
  return rt_status(
      sim_memset("cudaMemsetAsync", devPtr, value, count, gca_stream_of(stream, false)));
}

SHIM_API cudaError_t cudaDeviceSynchronize(void) {
  if (!shim_on_sim())
    FORWARD_RT(cudaDeviceSynchronize);
  int dev = 0;
  gca_status_t st = sim_current(&dev);
  if (st == GCA_OK)
    st = dev_ops()->ctx_synchronize(dev);
  return rt_status(st);
}

/* ---- errors ---- */

/* On cuda the program sees the first of the shim's and the runtime's errors. */
SHIM_API cudaError_t cudaGetLastError(void) {
  cudaError_t mine = last_error;
  last_error = cudaSuccess;
  if (shim_on_sim())
    return mine;
  __typeof__(&cudaGetLastError) real = REAL(cudaGetLastError);
  cudaError_t theirs = real ? real() : cudaSuccess;
  return mine != cudaSuccess ? mine : theirs;
}

SHIM_API cudaError_t cudaPeekAtLastError(void) {
  if (shim_on_sim() || last_error != cudaSuccess)
    return last_error;
  __typeof__(&cudaPeekAtLastError) real = REAL(cudaPeekAtLastError);
  return real ? real() : cudaSuccess;
}

/* X(code, description): the codes the shim produces, with cudart's texts. */
#define SHIM_ERROR_MAP(X)                                                                         \
  X(cudaSuccess, "no error")                                                                      \
  X(cudaErrorInvalidValue, "invalid argument")                                                    \
  X(cudaErrorMemoryAllocation, "out of memory")                                                   \
  X(cudaErrorInitializationError, "initialization error")                                         \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                                             \
  X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                         \
  X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                      \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                    \
  X(cudaErrorNotReady, "device not ready")                                                        \
  X(cudaErrorNotSupported, "operation not supported")                                             \
  X(cudaErrorIllegalState, "the operation cannot be performed in the present state")              \
  X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")        \
  X(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture") \
  X(cudaErrorStreamCaptureImplicit,                                                               \
    "operation would make the legacy stream depend on a capturing blocking stream")               \
  X(cudaErrorStreamCaptureUnmatched, "capture was not initiated in this stream")                  \
  X(cudaErrorStreamCaptureWrongThread,                                                            \
    "attempt to terminate a thread-local capture sequence from another thread")                   \
  X(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work")                         \
  X(cudaErrorGraphExecUpdateFailure,                                                              \
    "the graph update was not performed because it included changes which violated constraints "  \
    "specific to instantiated graph update")                                                      \
  X(cudaErrorUnknown, "unknown error")

SHIM_API const char *cudaGetErrorName(cudaError_t error) {
  if (!shim_on_sim()) {
    __typeof__(&cudaGetErrorName) real = REAL(cudaGetErrorName);
    if (real)
      return real(error);
  }
  switch (error) {
#define SHIM_ERROR_NAME(code, desc) \
  case code:                        \
    return #code;
    SHIM_ERROR_MAP(SHIM_ERROR_NAME)
#undef SHIM_ERROR_NAME
  default:
    return "cudaErrorUnknown";
  }
}

SHIM_API const char *cudaGetErrorString(cudaError_t error) {
  if (!shim_on_sim()) {
    __typeof__(&cudaGetErrorString) real = REAL(cudaGetErrorString);
    if (real)
      return real(error);
  }
  switch (error) {
#define SHIM_ERROR_STRING(code, desc) \
  case code:                          \
    return desc;
    SHIM_ERROR_MAP(SHIM_ERROR_STRING)
#undef SHIM_ERROR_STRING
  default:
    return "unrecognized error code";
  }
}
