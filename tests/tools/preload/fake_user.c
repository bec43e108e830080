/* SPDX-License-Identifier: Apache-2.0 */
/* fake_user.c - a CUDA program on the fake driver (tests/device/fake_libcuda.c)
 * that the preload tests run under LD_PRELOAD=libgca_preload.so with
 * GCA_DEVICE=cuda and GCA_CUDA_LIBRARY at the fake. Where a real program
 * links libcudart it links fake_cudart, and it opens the driver library
 * RTLD_LOCAL, as libcudart opens libcuda.so.1: so the driver's entry points
 * are in no global scope, as on a real machine. The shim's entry points are
 * looked up by name (dlsym(RTLD_DEFAULT)); the fakes count what reaches them.
 *
 * It checks the two paths a real GPU showed wrong:
 *   forwarded  frees of memory gca does not hold reach the driver's own
 *              cuMemFree_v2 / cuMemFreeAsync / cuMemFreeHost (found in the
 *              driver library itself, Note [Finding the driver] in
 *              tools/preload/preload.c) and the runtime's cudaFree /
 *              cudaFreeAsync / cudaFreeHost;
 *   refused    a second free of a gca allocation, device or pinned, and an
 *              interior pointer of a live one are invalid value (the
 *              runtime's last error set) and reach neither library (Note
 *              [Refused frees]); gca serves allocations afterwards.
 *   captures   a stream gca holds memory of, destroyed while another stream
 *              captures in global mode, is not waited for (the driver would
 *              refuse it and invalidate the capture): the shim counts the
 *              program's captures, through the driver (cuStreamBeginCapture_v2)
 *              and the runtime (cudaStreamBeginCapture), their per-thread and
 *              ToGraph forms, for the allocator
 *              (Note [Captures under the shim], tools/preload/capture.c); an
 *              end without a capture and a refused begin count nothing.
 * Modes (argv[1]): forward, refuse, captures; argv[2] == "nohost" leaves pinned host
 * memory out (built without jemalloc). Exit status 0 when everything held, 1
 * at the first that did not (printed), 2 for an unknown mode.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

/* fake_cudart.c */
int fake_cudart_frees(void);
int fake_cudart_host_frees(void);
void *fake_cudart_last_free(void);

#define EXPECT(cond, ...)                                                            \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "fake_user: %s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fprintf(stderr, "\n");                                                         \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

/* The shim's definition of `name`, checked to be the shim's. */
static void *shim_fn(const char *name) {
  void *f = dlsym(RTLD_DEFAULT, name);
  Dl_info info;
  EXPECT(f != NULL && dladdr(f, &info) && info.dli_fname && strstr(info.dli_fname, "gca_preload"),
         "%s resolves to libgca_preload.so (found in %s)", name,
         f && dladdr(f, &info) && info.dli_fname ? info.dli_fname : "nothing");
  return f;
}

#define SHIM_FN(name) ((__typeof__(&name))shim_fn(#name))

/* The fake driver's inspection functions, through its handle. */
static void *driver;
static int drv_count(const char *name) {
  int (*fn)(void) = (int (*)(void))(uintptr_t)dlsym(driver, name);
  EXPECT(fn != NULL, "the fake driver has %s", name);
  return fn();
}
static uint64_t drv_last_free(void) {
  uint64_t (*fn)(void) = (uint64_t(*)(void))(uintptr_t)dlsym(driver, "fake_cuda_last_named_free");
  EXPECT(fn != NULL, "the fake driver has fake_cuda_last_named_free");
  return fn();
}

/* Memory no allocator handed out. */
static uint64_t not_gca[8];

static void frees_outside_gca_are_forwarded(bool host) {
  __typeof__(&cuMemFree_v2) mem_free = SHIM_FN(cuMemFree_v2);
  __typeof__(&cuMemFreeAsync) free_async = SHIM_FN(cuMemFreeAsync);
  __typeof__(&cuMemFreeHost) free_host = SHIM_FN(cuMemFreeHost);
  CUdeviceptr foreign = (CUdeviceptr)(uintptr_t)&not_gca[1];
  CUresult r = mem_free(foreign);
  EXPECT(r == CUDA_SUCCESS, "cuMemFree_v2 of a foreign pointer reached the driver (result %d)",
         (int)r);
  EXPECT(drv_count("fake_cuda_named_frees") == 1 && drv_last_free() == foreign,
         "the driver's cuMemFree_v2 was given %#llx", (unsigned long long)foreign);
  r = free_async(foreign + 8, NULL);
  EXPECT(r == CUDA_SUCCESS, "cuMemFreeAsync of a foreign pointer reached the driver (result %d)",
         (int)r);
  EXPECT(drv_count("fake_cuda_named_frees") == 2 && drv_last_free() == foreign + 8,
         "the driver's cuMemFreeAsync was given the pointer");
  EXPECT(cudaFree(&not_gca[3]) == cudaSuccess && fake_cudart_frees() == 1 &&
             fake_cudart_last_free() == &not_gca[3],
         "cudaFree of a foreign pointer reached the runtime");
  EXPECT(cudaFreeAsync(&not_gca[4], NULL) == cudaSuccess && fake_cudart_frees() == 2,
         "cudaFreeAsync of a foreign pointer reached the runtime");
  if (!host)
    return;
  r = free_host(&not_gca[5]);
  EXPECT(r == CUDA_SUCCESS && drv_count("fake_cuda_named_host_frees") == 1 &&
             drv_last_free() == (uint64_t)(uintptr_t)&not_gca[5],
         "cuMemFreeHost of a foreign pointer reached the driver (result %d)", (int)r);
  EXPECT(cudaFreeHost(&not_gca[6]) == cudaSuccess && fake_cudart_host_frees() == 1 &&
             fake_cudart_last_free() == &not_gca[6],
         "cudaFreeHost of a foreign pointer reached the runtime");
}

/* Frees are answered as the runtime does: invalid value and the last error. */
static void expect_refused_rt(cudaError_t e, const char *what) {
  EXPECT(e == cudaErrorInvalidValue, "%s is cudaErrorInvalidValue, not %d", what, (int)e);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "%s set the last error", what);
  EXPECT(cudaGetLastError() == cudaSuccess, "and getting it reset it");
}

static void device_frees_inside_gca_are_refused(void) {
  __typeof__(&cuMemAlloc_v2) mem_alloc = SHIM_FN(cuMemAlloc_v2);
  __typeof__(&cuMemFree_v2) mem_free = SHIM_FN(cuMemFree_v2);
  __typeof__(&cuMemAllocAsync) alloc_async = SHIM_FN(cuMemAllocAsync);
  __typeof__(&cuMemFreeAsync) free_async = SHIM_FN(cuMemFreeAsync);
  __typeof__(&cudaMalloc) rt_malloc = SHIM_FN(cudaMalloc);
  __typeof__(&cudaMallocAsync) rt_malloc_async = SHIM_FN(cudaMallocAsync);
  int named = drv_count("fake_cuda_named_frees"), rt = fake_cudart_frees();

  /* the first allocation of 3 MiB is the start of its segment: what the driver
   * would free under gca's cache */
  CUdeviceptr d = 0;
  EXPECT(mem_alloc(&d, 3 << 20) == CUDA_SUCCESS && d != 0, "cuMemAlloc_v2 of 3 MiB");
  printf("fake_user: device pointer %p\n", (void *)(uintptr_t)d);
  EXPECT(mem_free(d) == CUDA_SUCCESS, "cuMemFree_v2");
  EXPECT(mem_free(d) == CUDA_ERROR_INVALID_VALUE, "a second cuMemFree_v2 is invalid");
  EXPECT(free_async(d, NULL) == CUDA_ERROR_INVALID_VALUE, "then a cuMemFreeAsync is invalid");
  EXPECT(alloc_async(&d, 4096, NULL) == CUDA_SUCCESS && d != 0, "cuMemAllocAsync");
  EXPECT(mem_free(d + 256) == CUDA_ERROR_INVALID_VALUE, "an interior pointer is invalid");
  EXPECT(free_async(d, NULL) == CUDA_SUCCESS, "cuMemFreeAsync");
  EXPECT(free_async(d, NULL) == CUDA_ERROR_INVALID_VALUE, "a second cuMemFreeAsync is invalid");
  EXPECT(drv_count("fake_cuda_named_frees") == named, "no refused free reached the driver");

  void *p = NULL;
  EXPECT(rt_malloc(&p, 1 << 20) == cudaSuccess && p != NULL, "cudaMalloc");
  EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
  expect_refused_rt(cudaFree(p), "a second cudaFree");
  expect_refused_rt(cudaFreeAsync(p, NULL), "then a cudaFreeAsync");
  EXPECT(rt_malloc_async(&p, 1000, NULL) == cudaSuccess && p != NULL, "cudaMallocAsync");
  expect_refused_rt(cudaFree((char *)p + 100), "a cudaFree of an interior pointer");
  EXPECT(cudaFreeAsync(p, NULL) == cudaSuccess, "cudaFreeAsync");
  expect_refused_rt(cudaFreeAsync(p, NULL), "a second cudaFreeAsync");
  EXPECT(fake_cudart_frees() == rt, "no refused free reached the runtime");

  /* gca serves allocations as before */
  EXPECT(mem_alloc(&d, 3 << 20) == CUDA_SUCCESS && d != 0 && mem_free(d) == CUDA_SUCCESS,
         "cuMemAlloc_v2 and cuMemFree_v2 after the refusals");
  EXPECT(rt_malloc(&p, 1 << 20) == cudaSuccess && cudaFree(p) == cudaSuccess,
         "cudaMalloc and cudaFree after the refusals");
}

static void host_frees_inside_gca_are_refused(void) {
  __typeof__(&cuMemHostAlloc) host_alloc = SHIM_FN(cuMemHostAlloc);
  __typeof__(&cuMemFreeHost) free_host = SHIM_FN(cuMemFreeHost);
  __typeof__(&cudaMallocHost) rt_host_alloc = SHIM_FN(cudaMallocHost);
  int named = drv_count("fake_cuda_named_host_frees"), rt = fake_cudart_host_frees();

  void *h = NULL;
  EXPECT(host_alloc(&h, 8192, 0) == CUDA_SUCCESS && h != NULL, "cuMemHostAlloc");
  printf("fake_user: host pointer %p\n", h);
  memset(h, 0x5c, 8192);
  EXPECT(free_host((char *)h + 64) == CUDA_ERROR_INVALID_VALUE, "an interior pointer is invalid");
  EXPECT(free_host(h) == CUDA_SUCCESS, "cuMemFreeHost");
  EXPECT(free_host(h) == CUDA_ERROR_INVALID_VALUE, "a second cuMemFreeHost is invalid");
  expect_refused_rt(cudaFreeHost(h), "then a cudaFreeHost");
  EXPECT(rt_host_alloc(&h, 4096) == cudaSuccess && h != NULL, "cudaMallocHost");
  EXPECT(cudaFreeHost(h) == cudaSuccess, "cudaFreeHost");
  expect_refused_rt(cudaFreeHost(h), "a second cudaFreeHost");
  EXPECT(drv_count("fake_cuda_named_host_frees") == named, "no refused free reached the driver");
  EXPECT(fake_cudart_host_frees() == rt, "no refused free reached the runtime");

  EXPECT(host_alloc(&h, 8192, 0) == CUDA_SUCCESS && h != NULL && free_host(h) == CUDA_SUCCESS,
         "cuMemHostAlloc and cuMemFreeHost after the refusals");
}

/* One round: b gets memory gca caches, then b is destroyed while a captures
 * (begun and ended through the driver's or the runtime's entry points). */
static void destroy_during_a_capture(bool runtime) {
  CUresult (*create)(CUstream *, unsigned) =
      (CUresult(*)(CUstream *, unsigned))(uintptr_t)dlsym(driver, "cuStreamCreate");
  __typeof__(&cuMemAllocAsync) alloc_async = SHIM_FN(cuMemAllocAsync);
  __typeof__(&cuMemFreeAsync) free_async = SHIM_FN(cuMemFreeAsync);
  __typeof__(&cuStreamDestroy_v2) destroy = SHIM_FN(cuStreamDestroy_v2);
  __typeof__(&cuStreamBeginCapture_v2) begin = SHIM_FN(cuStreamBeginCapture_v2);
  __typeof__(&cuStreamEndCapture) end = SHIM_FN(cuStreamEndCapture);
  __typeof__(&cudaStreamBeginCapture) rt_begin = SHIM_FN(cudaStreamBeginCapture);
  __typeof__(&cudaStreamEndCapture) rt_end = SHIM_FN(cudaStreamEndCapture);
  EXPECT(create != NULL, "the fake driver exports cuStreamCreate");
  CUdeviceptr p = 0; /* the first call: gca makes the device's context current */
  EXPECT(alloc_async(&p, 4096, NULL) == CUDA_SUCCESS && free_async(p, NULL) == CUDA_SUCCESS,
         "4 KiB allocated and freed on the legacy stream");
  CUstream a = NULL, b = NULL;
  EXPECT(create(&a, 0) == CUDA_SUCCESS && create(&b, 0) == CUDA_SUCCESS, "two streams");
  EXPECT(alloc_async(&p, 1 << 20, b) == CUDA_SUCCESS && free_async(p, b) == CUDA_SUCCESS,
         "1 MiB allocated and freed on b");
  int refusals = drv_count("fake_cuda_capture_refusals");
  CUgraph g = NULL;
  /* an end without a capture is the driver's error and uncounts nothing */
  EXPECT(runtime ? rt_end(a, (cudaGraph_t *)&g) == cudaErrorStreamCaptureUnmatched
                 : end(a, &g) == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
         "an end on a stream that is not capturing is unmatched");
  EXPECT(runtime ? rt_begin(a, cudaStreamCaptureModeGlobal) == cudaSuccess
                 : begin(a, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS,
         "a global-mode capture begins on a");
  /* a second begin is refused, and uncounts only itself */
  EXPECT(runtime ? rt_begin(a, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState
                 : begin(a, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE,
         "a second begin on a capturing stream is refused");
  EXPECT(destroy(b) == CUDA_SUCCESS, "b is destroyed while a captures");
  EXPECT(drv_count("fake_cuda_capture_refusals") == refusals,
         "the allocator made no call the capture forbids (%d refused)",
         drv_count("fake_cuda_capture_refusals") - refusals);
  EXPECT(runtime ? rt_end(a, (cudaGraph_t *)&g) == cudaSuccess : end(a, &g) == CUDA_SUCCESS,
         "the capture ends, not invalidated");
  EXPECT(destroy(a) == CUDA_SUCCESS, "a is destroyed");
  /* the capture is over: memory is served, and given back, as before */
  EXPECT(alloc_async(&p, 1 << 20, NULL) == CUDA_SUCCESS && free_async(p, NULL) == CUDA_SUCCESS,
         "an allocation after the capture");
}

/* The per-thread-default-stream and ToGraph forms (declared by the headers
 * only under --default-stream per-thread), through the shim. */
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t *deps,
                                               const cudaGraphEdgeData *edges, size_t n,
                                               enum cudaStreamCaptureMode mode);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *deps,
                                          const CUgraphEdgeData *edges, size_t n,
                                          CUstreamCaptureMode mode);

enum { DRV_PTSZ, RT_PTSZ, DRV_TO_GRAPH, RT_TO_GRAPH, DRV_TO_GRAPH_PTSZ, RT_TO_GRAPH_PTSZ, FORMS };
static const char *const form_names[FORMS] = {
    "cuStreamBeginCapture_ptsz",        "cudaStreamBeginCapture_ptsz",
    "cuStreamBeginCaptureToGraph",      "cudaStreamBeginCaptureToGraph",
    "cuStreamBeginCaptureToGraph_ptsz", "cudaStreamBeginCaptureToGraph_ptsz"};

/* Begins (end false) or ends a global-mode capture on s in `form`; true when
 * the shim's entry point (and the fake behind it) succeeded. */
static bool form_call(int form, CUstream s, bool end) {
  CUgraph g = NULL;
  bool ptsz = form == DRV_PTSZ || form == RT_PTSZ || form >= DRV_TO_GRAPH_PTSZ;
  bool rt = form == RT_PTSZ || form == RT_TO_GRAPH || form == RT_TO_GRAPH_PTSZ;
  if (end && rt)
    return (ptsz ? SHIM_FN(cudaStreamEndCapture_ptsz)(s, (cudaGraph_t *)&g)
                 : SHIM_FN(cudaStreamEndCapture)(s, (cudaGraph_t *)&g)) == cudaSuccess;
  if (end)
    return (ptsz ? SHIM_FN(cuStreamEndCapture_ptsz)(s, &g) : SHIM_FN(cuStreamEndCapture)(s, &g)) ==
           CUDA_SUCCESS;
  switch (form) {
  case DRV_PTSZ:
    return SHIM_FN(cuStreamBeginCapture_ptsz)(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS;
  case RT_PTSZ:
    return SHIM_FN(cudaStreamBeginCapture_ptsz)(s, cudaStreamCaptureModeGlobal) == cudaSuccess;
  case DRV_TO_GRAPH:
    return SHIM_FN(cuStreamBeginCaptureToGraph)(s, NULL, NULL, NULL, 0,
                                                CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS;
  case RT_TO_GRAPH:
    return SHIM_FN(cudaStreamBeginCaptureToGraph)(s, NULL, NULL, NULL, 0,
                                                  cudaStreamCaptureModeGlobal) == cudaSuccess;
  case DRV_TO_GRAPH_PTSZ:
    return SHIM_FN(cuStreamBeginCaptureToGraph_ptsz)(s, NULL, NULL, NULL, 0,
                                                     CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS;
  default:
    return SHIM_FN(cudaStreamBeginCaptureToGraph_ptsz)(s, NULL, NULL, NULL, 0,
                                                       cudaStreamCaptureModeGlobal) == cudaSuccess;
  }
}

/* The same round as destroy_during_a_capture through one of the other forms. */
static void destroy_during_a_capture_in(int form) {
  CUresult (*create)(CUstream *, unsigned) =
      (CUresult(*)(CUstream *, unsigned))(uintptr_t)dlsym(driver, "cuStreamCreate");
  __typeof__(&cuMemAllocAsync) alloc_async = SHIM_FN(cuMemAllocAsync);
  __typeof__(&cuMemFreeAsync) free_async = SHIM_FN(cuMemFreeAsync);
  __typeof__(&cuStreamDestroy_v2) destroy = SHIM_FN(cuStreamDestroy_v2);
  CUstream a = NULL, b = NULL;
  CUdeviceptr p = 0;
  EXPECT(create(&a, 0) == CUDA_SUCCESS && create(&b, 0) == CUDA_SUCCESS, "two streams");
  EXPECT(alloc_async(&p, 1 << 20, b) == CUDA_SUCCESS && free_async(p, b) == CUDA_SUCCESS,
         "1 MiB allocated and freed on b");
  int refusals = drv_count("fake_cuda_capture_refusals");
  EXPECT(form_call(form, a, false), "%s begins a capture", form_names[form]);
  EXPECT(destroy(b) == CUDA_SUCCESS, "b is destroyed while a captures");
  EXPECT(drv_count("fake_cuda_capture_refusals") == refusals,
         "%s: the allocator made no call the capture forbids", form_names[form]);
  EXPECT(form_call(form, a, true), "%s: the capture ends, not invalidated", form_names[form]);
  EXPECT(destroy(a) == CUDA_SUCCESS, "a is destroyed");
}

static void captures_are_counted(void) {
  destroy_during_a_capture(false);
  destroy_during_a_capture(true);
  for (int form = 0; form < FORMS; form++)
    destroy_during_a_capture_in(form);
  /* past the shim's table (256 captures at once) a capture begins uncounted
   * (logged), and its end uncounts nothing: the rounds after still hold */
  CUresult (*create)(CUstream *, unsigned) =
      (CUresult(*)(CUstream *, unsigned))(uintptr_t)dlsym(driver, "cuStreamCreate");
  __typeof__(&cuStreamBeginCapture_v2) begin = SHIM_FN(cuStreamBeginCapture_v2);
  __typeof__(&cuStreamEndCapture) end = SHIM_FN(cuStreamEndCapture);
  __typeof__(&cuStreamDestroy_v2) destroy = SHIM_FN(cuStreamDestroy_v2);
  enum { MANY = 257 };
  static CUstream s[MANY];
  for (int i = 0; i < MANY; i++)
    EXPECT(create(&s[i], 0) == CUDA_SUCCESS &&
               begin(s[i], CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS,
           "capture %d of %d begins", i, MANY);
  for (int i = MANY - 1; i >= 0; i--) {
    CUgraph g = NULL;
    EXPECT(end(s[i], &g) == CUDA_SUCCESS && destroy(s[i]) == CUDA_SUCCESS, "capture %d ends", i);
  }
  destroy_during_a_capture(false);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  bool host = !(argc > 2 && strcmp(argv[2], "nohost") == 0);
  const char *lib = getenv("GCA_CUDA_LIBRARY");
  EXPECT(lib != NULL && *lib, "GCA_CUDA_LIBRARY names the fake driver");
  driver = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  EXPECT(driver != NULL, "dlopen(%s): %s", lib, dlerror());
  EXPECT(dlsym(RTLD_DEFAULT, "fake_cuda_named_frees") == NULL,
         "the driver library is in no global scope");
  if (strcmp(mode, "forward") == 0) {
    frees_outside_gca_are_forwarded(host);
  } else if (strcmp(mode, "captures") == 0) {
    captures_are_counted();
  } else if (strcmp(mode, "refuse") == 0) {
    device_frees_inside_gca_are_refused();
    if (host)
      host_frees_inside_gca_are_refused();
  } else {
    fprintf(stderr, "fake_user: unknown mode '%s'\n", mode);
    return 2;
  }
  printf("fake_user: %s ok\n", mode);
  return 0;
}
