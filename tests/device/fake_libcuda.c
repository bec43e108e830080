/* SPDX-License-Identifier: Apache-2.0 */
/* fake_libcuda.c - a pretend CUDA driver for testing the cuda backend's own
 * logic on machines without a GPU: symbol resolution through
 * cuGetProcAddress at explicit ABI versions, the version guard, init's error
 * paths, context handling, the CUresult -> status mapping, kernel argument
 * marshalling, and graph-update reporting.
 *
 * The one idea: behave like the driver where the backend depends on it and
 * record what the backend asked for, nothing more. Devices do no work; handles
 * are small heap objects or tagged integers. Behaviour is set through the
 * environment when the library is first used:
 *   FAKE_CUDA_INIT=<CUresult>      what cuInit returns (default 0)
 *   FAKE_CUDA_VERSION=<n>          cuDriverGetVersion (default 12080)
 *   FAKE_CUDA_DEVICES=<n>          device count (default 2)
 *   FAKE_CUDA_MISSING=<name>       one entry point cuGetProcAddress does not know
 *   FAKE_CUDA_FABRIC=<mode>        fabric handles: "on" (devices report support
 *                                  and memory may request them), "denied"
 *                                  (reported, but cuMemCreate refuses them
 *                                  with CUDA_ERROR_NOT_PERMITTED, as without
 *                                  an IMEX channel); default off
 *   FAKE_CUDA_PEERLESS=<dev>       a device that cannot access any peer nor
 *                                  be accessed by one (cuDeviceCanAccessPeer)
 * and inspected through the fake_cuda_* functions at the bottom.
 *
 * A few entry points are exported by name as well, as the real library
 * exports all of them: those libgca_preload.so forwards to when a program
 * frees memory gca does not hold (cuMemFree_v2, cuMemFreeAsync,
 * cuMemFreeHost), asks for the current device (cuCtxGetDevice), and makes
 * and captures streams (cuStreamCreate, cuStreamDestroy_v2,
 * cuStreamBeginCapture_v2, cuStreamEndCapture, cuStreamIsCapturing). The
 * backend never calls them (it resolves every entry through
 * cuGetProcAddress), so what they record is what reached the driver from the
 * program through the shim.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT    __attribute__((visibility("default")))
#define MEM_LIMIT (1ull << 30)

typedef struct fake_stream {
  CUcontext ctx;
  bool capturing; /* between a begin and an end of capture */
  bool global;    /* that capture's mode is global */
  int epoch;      /* `invalidations` when it began */
} fake_stream_t;

/* Global-mode captures (cuda.h, cuThreadExchangeStreamCaptureMode): while any
 * thread captures in global mode, a thread whose own mode is not relaxed is
 * prohibited from potentially unsafe calls. The fake refuses its
 * synchronizations and queries then (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
 * and invalidates the captures under way (their end fails with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), as an H200 with driver 580 did;
 * cuCtxSynchronize is refused in relaxed mode too. */
static _Atomic int global_captures, invalidations, refusals;
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static bool capture_refuses(bool even_relaxed) {
  if (atomic_load(&global_captures) == 0 ||
      (!even_relaxed && thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED))
    return false;
  atomic_fetch_add(&refusals, 1);
  atomic_fetch_add(&invalidations, 1);
  return true;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int init_result, driver_version = 12080, ndev = 2;
static char missing[128];
enum { FABRIC_OFF, FABRIC_ON, FABRIC_DENIED };
static int fabric_mode;
static int peerless = -1;
static uint64_t peer_on[64]; /* bit p of peer_on[d]: d's context enabled access to p's */
static int initialized;
static __thread CUcontext current;

/* Records (inspected by tests). */
static int max_version_asked, over_version_asks, set_current_calls, capture_info_form;
static int module_loads;
static int null_stream_device =
    -1; /* device whose context was current at the last NULL-stream op */
static int special_stream_device = -1; /* device current at the last special-handle op */
static int special_stream_handle;      /* that handle's value (1 or 2) */
static int fabric_exports, fabric_imports, fabric_refusals;
static CUmemGenericAllocationHandle last_fabric_import;
static char last_kernel[32];
static unsigned last_grid, last_block;
static unsigned last_grid_dim[3], last_block_dim[3];
static uint64_t last_args[8]; /* the kernel's parameters, each widened to 64 bits */

static void setup(void) {
  const char *v;
  if ((v = getenv("FAKE_CUDA_INIT")))
    init_result = atoi(v);
  if ((v = getenv("FAKE_CUDA_VERSION")))
    driver_version = atoi(v);
  if ((v = getenv("FAKE_CUDA_DEVICES")))
    ndev = atoi(v);
  if ((v = getenv("FAKE_CUDA_MISSING")))
    strncpy(missing, v, sizeof(missing) - 1);
  if ((v = getenv("FAKE_CUDA_FABRIC")))
    fabric_mode = strcmp(v, "on") == 0 ? FABRIC_ON : strcmp(v, "denied") == 0 ? FABRIC_DENIED : 0;
  if ((v = getenv("FAKE_CUDA_PEERLESS")))
    peerless = atoi(v);
}

static CUcontext primary(int dev) {
  return (CUcontext)(uintptr_t)(0x1000 + 0x10 * dev);
}

static int ctx_device(CUcontext ctx) {
  return (int)(((uintptr_t)ctx - 0x1000) / 0x10);
}

#define NEED_INIT()                      \
  do {                                   \
    if (!initialized)                    \
      return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)
#define NEED_CTX()                       \
  do {                                   \
    NEED_INIT();                         \
    if (!current)                        \
      return CUDA_ERROR_INVALID_CONTEXT; \
  } while (0)

/* ---- the entry points ---- */

static CUresult f_init(unsigned flags) {
  (void)flags;
  if (init_result == CUDA_SUCCESS)
    initialized = 1;
  return (CUresult)init_result;
}
static CUresult f_driver_version(int *v) {
  *v = driver_version;
  return CUDA_SUCCESS;
}
static CUresult f_error_name(CUresult r, const char **s) {
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY:
    *s = "CUDA_ERROR_OUT_OF_MEMORY";
    return CUDA_SUCCESS;
  case CUDA_ERROR_NO_DEVICE:
    *s = "CUDA_ERROR_NO_DEVICE";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_HANDLE:
    *s = "CUDA_ERROR_INVALID_HANDLE";
    return CUDA_SUCCESS;
  case CUDA_ERROR_LAUNCH_FAILED:
    *s = "CUDA_ERROR_LAUNCH_FAILED";
    return CUDA_SUCCESS;
  case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
    *s = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    return CUDA_SUCCESS;
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
    *s = "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED";
    return CUDA_SUCCESS;
  case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
    *s = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    return CUDA_SUCCESS;
  case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
    *s = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    return CUDA_SUCCESS;
  default:
    return CUDA_ERROR_INVALID_VALUE;
  }
}
static CUresult f_error_string(CUresult r, const char **s) {
  const char *name;
  if (f_error_name(r, &name) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  *s = r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake description";
  return CUDA_SUCCESS;
}
static CUresult f_device_get(CUdevice *d, int i) {
  NEED_INIT();
  if (i < 0 || i >= ndev)
    return CUDA_ERROR_INVALID_DEVICE;
  *d = 100 + i;
  return CUDA_SUCCESS;
}
static CUresult f_device_count(int *n) {
  NEED_INIT();
  *n = ndev;
  return CUDA_SUCCESS;
}
static CUresult f_device_attr(int *v, CUdevice_attribute a, CUdevice d) {
  NEED_INIT();
  if (a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)
    *v = fabric_mode != FABRIC_OFF;
  else
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : (int)(d - 100);
  return CUDA_SUCCESS;
}
static CUresult f_device_name(char *name, int len, CUdevice d) {
  NEED_INIT();
  strncpy(name, "Fake GPU", (size_t)len);
  name[len - 1] = '\0';
  return CUDA_SUCCESS;
}
static CUresult f_can_access_peer(int *can, CUdevice a, CUdevice b) {
  *can = a != b && a - 100 != peerless && b - 100 != peerless;
  return CUDA_SUCCESS;
}
static CUresult f_primary_retain(CUcontext *c, CUdevice d) {
  NEED_INIT();
  *c = primary(d - 100);
  return CUDA_SUCCESS;
}
static CUresult f_ctx_get_current(CUcontext *c) {
  NEED_INIT();
  *c = current;
  return CUDA_SUCCESS;
}
static CUresult f_ctx_set_current(CUcontext c) {
  NEED_INIT();
  set_current_calls++;
  current = c;
  return CUDA_SUCCESS;
}
static CUresult f_ctx_get_device(CUdevice *d) {
  NEED_CTX();
  *d = 100 + ctx_device(current);
  return CUDA_SUCCESS;
}
static CUresult f_ctx_sync(void) {
  NEED_CTX();
  return capture_refuses(true) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
/* As the driver: errors checked in the order its documentation lists them. */
static CUresult f_ctx_enable_peer(CUcontext peer, unsigned flags) {
  NEED_CTX();
  int d = ctx_device(current), p = ctx_device(peer);
  if (peer == current || p < 0 || p >= ndev)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  int can = 0;
  f_can_access_peer(&can, 100 + d, 100 + p);
  if (!can)
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if ((peer_on[d] >> p) & 1u)
    return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  peer_on[d] |= (uint64_t)1 << p;
  return CUDA_SUCCESS;
}
static CUresult f_mem_get_info(size_t *f, size_t *t) {
  NEED_CTX();
  *f = MEM_LIMIT / 2;
  *t = MEM_LIMIT;
  return CUDA_SUCCESS;
}
static CUresult f_mem_alloc(CUdeviceptr *p, size_t size) {
  NEED_CTX();
  if (size > MEM_LIMIT)
    return CUDA_ERROR_OUT_OF_MEMORY;
  /* a bump range per device: allocations do not overlap (nothing backs them) */
  static uint64_t next[64];
  int d = ctx_device(current) & 63;
  *p = 0x7f0000000000ull + ((uint64_t)d << 36) + next[d];
  next[d] += (size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  return CUDA_SUCCESS;
}
static CUresult f_mem_free(CUdeviceptr p) {
  NEED_CTX();
  return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
/* Pinned host memory: one registration and a few allocations, as the driver
 * refuses them (flags must be PORTABLE, what the backend asks for). */
static void *registered;
static unsigned last_host_flags;
static CUresult f_host_alloc(void **pp, size_t size, unsigned flags) {
  NEED_CTX();
  last_host_flags = flags;
  if (size > MEM_LIMIT)
    return CUDA_ERROR_OUT_OF_MEMORY;
  /* page-aligned, and from 2 MiB on 2 MiB-aligned as large anonymous mappings
   * are: jemalloc asks that of the pinned host allocator's extents */
  size_t align = size >= (2u << 20) ? (2u << 20) : 4096;
  size_t len = size ? (size + align - 1) / align * align : align;
  *pp = aligned_alloc(align, len);
  if (*pp)
    memset(*pp, 0, len);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_free_host(void *p) {
  NEED_CTX();
  if (!p)
    return CUDA_ERROR_INVALID_VALUE;
  free(p);
  return CUDA_SUCCESS;
}
static CUresult f_host_register(void *p, size_t size, unsigned flags) {
  NEED_CTX();
  last_host_flags = flags;
  if (!p || !size)
    return CUDA_ERROR_INVALID_VALUE;
  if (registered)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  registered = p;
  return CUDA_SUCCESS;
}
static CUresult f_host_unregister(void *p) {
  NEED_CTX();
  if (!p || p != registered)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  registered = NULL;
  return CUDA_SUCCESS;
}
static CUresult f_granularity(size_t *g, const CUmemAllocationProp *prop,
                              CUmemAllocationGranularity_flags o) {
  NEED_INIT();
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  *g = o == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED ? (4u << 20) : (2u << 20);
  return CUDA_SUCCESS;
}
static CUresult f_reserve(CUdeviceptr *p, size_t s, size_t a, CUdeviceptr addr,
                          unsigned long long fl) {
  *p = 0x600000000000ull;
  return CUDA_SUCCESS;
}
static CUresult f_addr_free(CUdeviceptr p, size_t s) {
  return CUDA_SUCCESS;
}
static CUresult f_mem_create(CUmemGenericAllocationHandle *h, size_t s,
                             const CUmemAllocationProp *prop, unsigned long long fl) {
  if (s > MEM_LIMIT)
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) {
    if (fabric_mode == FABRIC_OFF)
      return CUDA_ERROR_INVALID_VALUE;
    if (fabric_mode == FABRIC_DENIED) {
      fabric_refusals++;
      return CUDA_ERROR_NOT_PERMITTED;
    }
  }
  /* The handle records the device and the handle types requested. */
  *h = ((uint64_t)prop->location.id << 8) | (uint64_t)prop->requestedHandleTypes;
  return CUDA_SUCCESS;
}
static CUresult f_mem_release(CUmemGenericAllocationHandle h) {
  return CUDA_SUCCESS;
}
static CUresult f_mem_map(CUdeviceptr p, size_t s, size_t o, CUmemGenericAllocationHandle h,
                          unsigned long long fl) {
  return CUDA_SUCCESS;
}
static CUresult f_mem_unmap(CUdeviceptr p, size_t s) {
  return CUDA_SUCCESS;
}
static CUresult f_set_access(CUdeviceptr p, size_t s, const CUmemAccessDesc *d, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (d[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE || d[i].location.id >= ndev)
      return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
/* What the handle records (f_mem_create): the device and the handle types. */
static CUresult f_get_props(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
  memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = (int)((h >> 8) & 0xff);
  prop->requestedHandleTypes = (CUmemAllocationHandleType)(h & 0xff);
  return CUDA_SUCCESS;
}
/* A fabric handle: "FAKEFAB" then the allocation handle, then a pattern. */
static const char fabric_magic[8] = "FAKEFAB";

static CUresult f_export(void *sh, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
                         unsigned long long fl) {
  if (t == CU_MEM_HANDLE_TYPE_FABRIC) {
    if (!(h & CU_MEM_HANDLE_TYPE_FABRIC))
      return CUDA_ERROR_INVALID_VALUE;
    CUmemFabricHandle *fh = sh;
    memcpy(fh->data, fabric_magic, sizeof(fabric_magic));
    memcpy(fh->data + 8, &h, sizeof(h));
    for (size_t i = 16; i < sizeof(fh->data); i++)
      fh->data[i] = (unsigned char)i;
    fabric_exports++;
    return CUDA_SUCCESS;
  }
  if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(h & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  *(int *)sh = 42;
  return CUDA_SUCCESS;
}
/* A fabric import yields the exported handle with bit 16 set. */
static CUresult f_import(CUmemGenericAllocationHandle *h, void *sh, CUmemAllocationHandleType t) {
  if (t == CU_MEM_HANDLE_TYPE_FABRIC) {
    const CUmemFabricHandle *fh = sh;
    if (fabric_mode != FABRIC_ON)
      return CUDA_ERROR_NOT_PERMITTED;
    if (memcmp(fh->data, fabric_magic, sizeof(fabric_magic)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    memcpy(h, fh->data + 8, sizeof(*h));
    *h |= 1u << 16;
    last_fabric_import = *h;
    fabric_imports++;
    return CUDA_SUCCESS;
  }
  *h = (uint64_t)(uintptr_t)sh;
  return CUDA_SUCCESS;
}
static CUresult f_stream_create(CUstream *s, unsigned fl, int prio) {
  NEED_CTX();
  fake_stream_t *fs = calloc(1, sizeof(*fs));
  fs->ctx = current;
  *s = (CUstream)(void *)fs;
  return CUDA_SUCCESS;
}
#define SPECIAL_STREAM(s) ((s) == CU_STREAM_LEGACY || (s) == CU_STREAM_PER_THREAD)
static CUresult f_stream_get_ctx(CUstream s, CUcontext *c) {
  NEED_INIT();
  if (!s || SPECIAL_STREAM(s)) {
    if (!current)
      return CUDA_ERROR_INVALID_CONTEXT;
    *c = current;
    return CUDA_SUCCESS;
  }
  *c = ((fake_stream_t *)(void *)s)->ctx;
  return CUDA_SUCCESS;
}
/* Stream work must run with the stream's context current, as the driver wants. */
static CUresult stream_ok(CUstream s) {
  NEED_CTX();
  if (!s)
    null_stream_device = ctx_device(current);
  if (SPECIAL_STREAM(s)) {
    special_stream_device = ctx_device(current);
    special_stream_handle = (int)(uintptr_t)s;
    return CUDA_SUCCESS;
  }
  if (s && ((fake_stream_t *)(void *)s)->ctx != current)
    return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}
static CUresult f_stream_destroy(CUstream s) {
  CUresult r = stream_ok(s);
  if (r == CUDA_SUCCESS)
    free(s);
  return r;
}
static CUresult f_stream_sync(CUstream s) {
  CUresult r = stream_ok(s);
  return r == CUDA_SUCCESS && capture_refuses(false) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : r;
}
static CUresult f_stream_query(CUstream s) {
  CUresult r = stream_ok(s);
  if (r == CUDA_SUCCESS && capture_refuses(false))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_READY;
}
static CUresult f_stream_wait(CUstream s, CUevent e, unsigned fl) {
  return stream_ok(s);
}
static CUresult f_event_create(CUevent *e, unsigned fl) {
  NEED_CTX();
  *e = (CUevent)(uintptr_t)(0x5000 + fl);
  return CUDA_SUCCESS;
}
static CUresult f_event_any(CUevent e) {
  NEED_CTX();
  return capture_refuses(false) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
static CUresult f_event_record(CUevent e, CUstream s) {
  return stream_ok(s);
}
static CUresult f_elapsed_v1(float *ms, CUevent a, CUevent b) {
  *ms = 1.0f;
  return CUDA_SUCCESS;
}
static CUresult f_elapsed_v2(float *ms, CUevent a, CUevent b) {
  *ms = 2.0f;
  return CUDA_SUCCESS;
}
static CUresult f_host_func(CUstream s, CUhostFn fn, void *ud) {
  CUresult r = stream_ok(s);
  if (r == CUDA_SUCCESS)
    fn(ud);
  return r;
}
static CUresult f_memcpy(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  return stream_ok(st);
}
static CUresult f_memset8(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
  return stream_ok(st);
}
static CUresult f_memset32(CUdeviceptr d, unsigned v, size_t n, CUstream st) {
  return stream_ok(st);
}
static CUresult f_module_load(CUmodule *m, const void *image) {
  NEED_CTX();
  const char *ptx = image;
  if (strncmp(ptx, ".version", 8) != 0)
    return CUDA_ERROR_INVALID_PTX;
  module_loads++;
  *m = (CUmodule)(uintptr_t)(0x9000 + ctx_device(current));
  return CUDA_SUCCESS;
}
static char function_names[8][32] = {"gca_fill_u32",   "gca_add_u32",    "gca_sleep_ns",
                                     "gca_philox_u32", "gca_copy_batch", "gca_gemm_f32",
                                     "gca_ew_f32",     "gca_dot_f32"};
static CUresult f_module_get_function(CUfunction *f, CUmodule m, const char *name) {
  const char *ptx_entry = NULL;
  for (int i = 0; i < 8; i++)
    if (strcmp(name, function_names[i]) == 0)
      ptx_entry = function_names[i];
  if (!ptx_entry)
    return CUDA_ERROR_NOT_FOUND;
  *f = (CUfunction)(void *)ptx_entry;
  return CUDA_SUCCESS;
}
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                         void **extra) {
  CUresult r = stream_ok(s);
  if (r != CUDA_SUCCESS)
    return r;
  const char *name = (const char *)(void *)f;
  strncpy(last_kernel, name, sizeof(last_kernel) - 1);
  last_grid = gx * gy * gz;
  last_block = bx * by * bz;
  last_grid_dim[0] = gx, last_grid_dim[1] = gy, last_grid_dim[2] = gz;
  last_block_dim[0] = bx, last_block_dim[1] = by, last_block_dim[2] = bz;
  memset(last_args, 0, sizeof(last_args));
  if (strcmp(name, "gca_fill_u32") == 0) {
    last_args[0] = *(uint64_t *)params[0];
    last_args[1] = *(uint32_t *)params[1];
    last_args[2] = *(uint32_t *)params[2];
    last_args[3] = *(uint64_t *)params[3];
  } else if (strcmp(name, "gca_add_u32") == 0) {
    for (int i = 0; i < 4; i++)
      last_args[i] = *(uint64_t *)params[i];
  } else if (strcmp(name, "gca_copy_batch") == 0) {
    last_args[0] = *(uint64_t *)params[0];
    last_args[1] = *(uint64_t *)params[1];
    last_args[2] = gy; /* the entries' dimension */
  } else if (strcmp(name, "gca_gemm_f32") == 0) {
    for (int i = 0; i < 3; i++) /* c, a, b */
      last_args[i] = *(uint64_t *)params[i];
    for (int i = 3; i < 7; i++) /* m, n, k, flags */
      last_args[i] = *(uint32_t *)params[i];
  } else if (strcmp(name, "gca_ew_f32") == 0) {
    for (int i = 0; i < 4; i++) /* dst, a, b, count */
      last_args[i] = *(uint64_t *)params[i];
    for (int i = 4; i < 7; i++) /* op, s (its bits), u */
      last_args[i] = *(uint32_t *)params[i];
  } else if (strcmp(name, "gca_dot_f32") == 0) {
    for (int i = 0; i < 4; i++) /* dst, a, b, count */
      last_args[i] = *(uint64_t *)params[i];
    last_args[4] = *(uint32_t *)params[4]; /* s (its bits) */
  } else {
    last_args[0] = *(uint64_t *)params[0];
  }
  return CUDA_SUCCESS;
}
/* Capture as the driver keeps it per stream: a begin on a capturing stream
 * is CUDA_ERROR_ILLEGAL_STATE, an end on one that is not
 * CUDA_ERROR_STREAM_CAPTURE_UNMATCHED (cuda.h: "the capture was not
 * initiated in this stream"; contract test end_without_capture_is_unmatched);
 * an end always
 * ends the sequence, and after fake_cuda_invalidate_next_capture it fails
 * with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (the capture was invalidated).
 * Streams the fake does not make (NULL, the special handles) never capture. */
static bool invalidate_next_capture;
static fake_stream_t *capture_stream(CUstream s) {
  return s && !SPECIAL_STREAM(s) ? (fake_stream_t *)(void *)s : NULL;
}
static CUresult f_begin_capture(CUstream s, CUstreamCaptureMode mode) {
  (void)mode;
  CUresult r = stream_ok(s);
  if (r != CUDA_SUCCESS)
    return r;
  fake_stream_t *fs = capture_stream(s);
  if (!fs)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (fs->capturing)
    return CUDA_ERROR_ILLEGAL_STATE;
  fs->capturing = true;
  fs->global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  fs->epoch = atomic_load(&invalidations);
  if (fs->global)
    atomic_fetch_add(&global_captures, 1);
  return CUDA_SUCCESS;
}
static CUresult f_end_capture(CUstream s, CUgraph *g) {
  CUresult r = stream_ok(s);
  if (r != CUDA_SUCCESS)
    return r;
  fake_stream_t *fs = capture_stream(s);
  if (!fs || !fs->capturing)
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED; /* "not initiated in this stream" */
  fs->capturing = false;
  if (fs->global)
    atomic_fetch_sub(&global_captures, 1);
  if (invalidate_next_capture || fs->epoch != atomic_load(&invalidations)) {
    invalidate_next_capture = false;
    *g = NULL;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *g = (CUgraph)(uintptr_t)0x7000;
  return CUDA_SUCCESS;
}
static CUstreamCaptureStatus capture_status(CUstream s) {
  fake_stream_t *fs = capture_stream(s);
  return fs && fs->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
}
static CUresult f_capture_info_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                  const CUgraphNode **d, size_t *n) {
  capture_info_form = 2;
  *st = capture_status(s);
  *id = 77;
  return stream_ok(s);
}
static CUresult f_capture_info_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                  const CUgraphNode **d, const void **e, size_t *n) {
  capture_info_form = 3;
  *st = capture_status(s);
  *id = 78;
  return stream_ok(s);
}
static CUresult f_exchange_mode(CUstreamCaptureMode *m) {
  CUstreamCaptureMode old = thread_mode;
  thread_mode = *m;
  *m = old;
  return CUDA_SUCCESS;
}
static CUresult f_graph_nodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
  if (nodes)
    for (size_t i = 0; i < *n && i < 5; i++)
      nodes[i] = (CUgraphNode)(uintptr_t)(0x8000 + i);
  *n = 5;
  return CUDA_SUCCESS;
}
static CUresult f_instantiate(CUgraphExec *e, CUgraph g, unsigned long long fl) {
  NEED_CTX();
  *e = (CUgraphExec)(uintptr_t)0x7100;
  return CUDA_SUCCESS;
}
static CUresult f_graph_launch(CUgraphExec e, CUstream s) {
  return stream_ok(s);
}
/* Rejects any graph other than 0x7000, blaming its third node. */
static CUresult f_exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
  if (g == (CUgraph)(uintptr_t)0x7000) {
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (g == (CUgraph)(uintptr_t)0x7778) { /* a kernel node took a CDP function */
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE;
    info->errorNode = (CUgraphNode)(uintptr_t)0x8001;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  if (g == (CUgraph)(uintptr_t)0x7779) { /* node counts differ: no error node */
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    info->errorNode = NULL;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  info->errorNode = (CUgraphNode)(uintptr_t)0x8002;
  return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}
static CUresult f_graph_any(CUgraph g) {
  return CUDA_SUCCESS;
}
static CUresult f_exec_any(CUgraphExec e) {
  return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

typedef struct entry {
  const char *name;
  int since; /* the ABI version this entry's signature belongs to */
  void *fn;
} entry_t;

#define E(name, since, fn) \
  { name, since, (void *)(fn) }
static const entry_t entries[] = {
    E("cuGetErrorName", 6000, f_error_name),
    E("cuGetErrorString", 6000, f_error_string),
    E("cuInit", 2000, f_init),
    E("cuDriverGetVersion", 2020, f_driver_version),
    E("cuDeviceGet", 2000, f_device_get),
    E("cuDeviceGetCount", 2000, f_device_count),
    E("cuDeviceGetAttribute", 2000, f_device_attr),
    E("cuDeviceGetName", 2000, f_device_name),
    E("cuDeviceCanAccessPeer", 4000, f_can_access_peer),
    E("cuDevicePrimaryCtxRetain", 7000, f_primary_retain),
    E("cuCtxGetCurrent", 4000, f_ctx_get_current),
    E("cuCtxSetCurrent", 4000, f_ctx_set_current),
    E("cuCtxGetDevice", 2000, f_ctx_get_device),
    E("cuCtxSynchronize", 2000, f_ctx_sync),
    E("cuCtxEnablePeerAccess", 4000, f_ctx_enable_peer),
    E("cuMemGetInfo", 3020, f_mem_get_info),
    E("cuMemAlloc", 3020, f_mem_alloc),
    E("cuMemFree", 3020, f_mem_free),
    E("cuMemHostAlloc", 3020, f_host_alloc),
    E("cuMemFreeHost", 2000, f_free_host),
    E("cuMemHostRegister", 6050, f_host_register),
    E("cuMemHostUnregister", 4000, f_host_unregister),
    E("cuMemGetAllocationGranularity", 10020, f_granularity),
    E("cuMemAddressReserve", 10020, f_reserve),
    E("cuMemAddressFree", 10020, f_addr_free),
    E("cuMemCreate", 10020, f_mem_create),
    E("cuMemRelease", 10020, f_mem_release),
    E("cuMemMap", 10020, f_mem_map),
    E("cuMemUnmap", 10020, f_mem_unmap),
    E("cuMemSetAccess", 10020, f_set_access),
    E("cuMemExportToShareableHandle", 10020, f_export),
    E("cuMemImportFromShareableHandle", 10020, f_import),
    E("cuMemGetAllocationPropertiesFromHandle", 10020, f_get_props),
    E("cuStreamCreateWithPriority", 5050, f_stream_create),
    E("cuStreamDestroy", 4000, f_stream_destroy),
    E("cuStreamSynchronize", 2000, f_stream_sync),
    E("cuStreamQuery", 2000, f_stream_query),
    E("cuStreamWaitEvent", 3020, f_stream_wait),
    E("cuStreamGetCtx", 9020, f_stream_get_ctx),
    E("cuEventCreate", 2000, f_event_create),
    E("cuEventDestroy", 4000, f_event_any),
    E("cuEventRecord", 2000, f_event_record),
    E("cuEventQuery", 2000, f_event_any),
    E("cuEventSynchronize", 2000, f_event_any),
    E("cuEventElapsedTime", 2000, f_elapsed_v1),
    E("cuEventElapsedTime", 12080, f_elapsed_v2),
    E("cuLaunchHostFunc", 10000, f_host_func),
    E("cuMemcpyAsync", 4000, f_memcpy),
    E("cuMemsetD8Async", 3020, f_memset8),
    E("cuMemsetD32Async", 3020, f_memset32),
    E("cuModuleLoadData", 2000, f_module_load),
    E("cuModuleGetFunction", 2000, f_module_get_function),
    E("cuLaunchKernel", 4000, f_launch),
    E("cuStreamBeginCapture", 10010, f_begin_capture),
    E("cuStreamEndCapture", 10000, f_end_capture),
    E("cuStreamGetCaptureInfo", 11030, f_capture_info_v2),
    E("cuStreamGetCaptureInfo", 12030, f_capture_info_v3),
    E("cuThreadExchangeStreamCaptureMode", 10010, f_exchange_mode),
    E("cuGraphGetNodes", 10000, f_graph_nodes),
    E("cuGraphInstantiateWithFlags", 11040, f_instantiate),
    E("cuGraphUpload", 11010, f_graph_launch),
    E("cuGraphLaunch", 10000, f_graph_launch),
    E("cuGraphExecUpdate", 12000, f_exec_update),
    E("cuGraphDestroy", 10000, f_graph_any),
    E("cuGraphExecDestroy", 10000, f_exec_any),
};
#undef E

/* As the driver: a version above the driver's is CUDA_ERROR_INVALID_VALUE; an
 * unknown name or one not yet introduced at `version` is success with NULL. */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *found) {
  pthread_once(&once, setup);
  if (version > max_version_asked)
    max_version_asked = version;
  *pfn = NULL;
  if (version > driver_version) {
    over_version_asks++;
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  int best = 0;
  for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
    if (strcmp(entries[i].name, symbol) != 0 || strcmp(symbol, missing) == 0)
      continue;
    if (entries[i].since > version) {
      if (status != CU_GET_PROC_ADDRESS_SUCCESS)
        status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      continue;
    }
    if (entries[i].since >= best) {
      best = entries[i].since;
      *pfn = entries[i].fn;
      status = CU_GET_PROC_ADDRESS_SUCCESS;
    }
  }
  if (found)
    *found = status;
  return CUDA_SUCCESS;
}

/* ---- entry points by name (a program's, through the shim) ---- */

/* Calls of the named frees, and the last pointer one was given. They free
 * nothing: what a program hands them is not memory the fake gave out. */
static int named_frees, named_host_frees;
static uint64_t last_named_free;

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  named_frees++;
  last_named_free = dptr;
  return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  (void)hStream;
  return cuMemFree_v2(dptr);
}
EXPORT CUresult cuMemFreeHost(void *p) {
  named_host_frees++;
  last_named_free = (uint64_t)(uintptr_t)p;
  return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
/* A program's captures, through the shim (Note [Captures under the shim],
 * tools/preload/capture.c), and its streams. */
EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return f_begin_capture(hStream, mode);
}
EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  return f_end_capture(hStream, phGraph);
}
EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *st) {
  *st = capture_status(hStream);
  return stream_ok(hStream);
}
/* The per-thread-default-stream forms and the ToGraph begins (the graph and
 * its dependencies are not modelled: a capture begins as with the plain
 * begin). cuda.h declares the _ptsz names only under that option. */
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream, CUstreamCaptureMode mode);
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *st);
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                 const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode);
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return f_begin_capture(hStream, mode);
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
  return f_end_capture(hStream, phGraph);
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *st) {
  return cuStreamIsCapturing(hStream, st);
}
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                            const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                            size_t n, CUstreamCaptureMode mode) {
  (void)hGraph, (void)deps, (void)edges, (void)n;
  return f_begin_capture(hStream, mode);
}
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                 const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode) {
  return cuStreamBeginCaptureToGraph(hStream, hGraph, deps, edges, n, mode);
}
EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) {
  return f_stream_create(phStream, flags, 0);
}
EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return f_stream_destroy(hStream);
}
/* A program's CUdevice is the device's ordinal, as the real driver's is; the
 * fake's own handles (100 + ordinal) are for catching the backend mixing
 * the two up, and the backend never calls this by name. */
EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
  NEED_CTX();
  *device = ctx_device(current);
  return CUDA_SUCCESS;
}

/* ---- inspection ---- */

EXPORT int fake_cuda_max_version_asked(void);
EXPORT int fake_cuda_over_version_asks(void);
EXPORT int fake_cuda_set_current_calls(void);
EXPORT int fake_cuda_capture_info_form(void);
EXPORT void fake_cuda_invalidate_next_capture(void);
EXPORT int fake_cuda_null_stream_device(void);
EXPORT int fake_cuda_special_stream_device(void);
EXPORT int fake_cuda_special_stream_handle(void);
EXPORT int fake_cuda_current_device(void);
EXPORT int fake_cuda_module_loads(void);
EXPORT int fake_cuda_fabric_exports(void);
EXPORT int fake_cuda_fabric_imports(void);
EXPORT int fake_cuda_fabric_refusals(void);
EXPORT uint64_t fake_cuda_last_fabric_import(void);
EXPORT const char *fake_cuda_last_kernel(unsigned *grid, unsigned *block, uint64_t args[4]);
EXPORT const char *fake_cuda_last_launch(unsigned grid[3], unsigned block[3], uint64_t args[8]);
EXPORT int fake_cuda_peer_enabled(int dev, int peer);
EXPORT int fake_cuda_capture_refusals(void);
EXPORT int fake_cuda_capture_refusals(void) {
  return atomic_load(&refusals);
}
EXPORT int fake_cuda_named_frees(void);
EXPORT int fake_cuda_named_host_frees(void);
EXPORT uint64_t fake_cuda_last_named_free(void);

EXPORT int fake_cuda_last_host_flags(void);
EXPORT int fake_cuda_last_host_flags(void) {
  return (int)last_host_flags;
}
EXPORT int fake_cuda_max_version_asked(void) {
  return max_version_asked;
}
EXPORT int fake_cuda_over_version_asks(void) {
  return over_version_asks;
}
EXPORT int fake_cuda_set_current_calls(void) {
  return set_current_calls;
}
EXPORT int fake_cuda_capture_info_form(void) {
  return capture_info_form;
}
EXPORT void fake_cuda_invalidate_next_capture(void) {
  invalidate_next_capture = true;
}
EXPORT int fake_cuda_null_stream_device(void) {
  return null_stream_device;
}
EXPORT int fake_cuda_special_stream_device(void) {
  return special_stream_device;
}
EXPORT int fake_cuda_special_stream_handle(void) {
  return special_stream_handle;
}
/* The device of the calling thread's current context, -1 when none is. */
EXPORT int fake_cuda_current_device(void) {
  return current ? ctx_device(current) : -1;
}
EXPORT int fake_cuda_module_loads(void) {
  return module_loads;
}
EXPORT int fake_cuda_fabric_exports(void) {
  return fabric_exports;
}
EXPORT int fake_cuda_fabric_imports(void) {
  return fabric_imports;
}
EXPORT int fake_cuda_fabric_refusals(void) {
  return fabric_refusals;
}
EXPORT uint64_t fake_cuda_last_fabric_import(void) {
  return last_fabric_import;
}
EXPORT const char *fake_cuda_last_kernel(unsigned *grid, unsigned *block, uint64_t args[4]) {
  *grid = last_grid;
  *block = last_block;
  memcpy(args, last_args, 4 * sizeof(*args));
  return last_kernel;
}
/* The last launch's grid and block by dimension and all its parameters. */
EXPORT const char *fake_cuda_last_launch(unsigned grid[3], unsigned block[3], uint64_t args[8]) {
  memcpy(grid, last_grid_dim, sizeof(last_grid_dim));
  memcpy(block, last_block_dim, sizeof(last_block_dim));
  memcpy(args, last_args, sizeof(last_args));
  return last_kernel;
}
/* 1 when dev's context has enabled peer access to peer's, else 0. */
EXPORT int fake_cuda_peer_enabled(int dev, int peer) {
  return dev >= 0 && dev < 64 && peer >= 0 && peer < 64 ? (int)((peer_on[dev] >> peer) & 1u) : 0;
}
/* Calls of the named cuMemFree_v2 / cuMemFreeAsync, of the named
 * cuMemFreeHost, and the pointer the last of them was given. */
EXPORT int fake_cuda_named_frees(void) {
  return named_frees;
}
EXPORT int fake_cuda_named_host_frees(void) {
  return named_host_frees;
}
EXPORT uint64_t fake_cuda_last_named_free(void) {
  return last_named_free;
}
