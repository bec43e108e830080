/* SPDX-License-Identifier: Apache-2.0 */
/* fake_cudart.c - the few CUDA runtime entry points libgca_preload.so
 * forwards to on the cuda backend, for fake_user (which links this library
 * where a real program links libcudart): the frees a program makes of memory
 * gca does not hold, the current device, the last error, and stream captures
 * (passed to the fake driver's, as libcudart passes them to libcuda).
 *
 * The one idea: record what reached the runtime and answer as the real one
 * answered on the H200 when the shim handed it a pointer of gca's segment:
 * cudaSuccess. A free the shim should have refused and forwarded instead
 * shows up both in the count and in the result the program sees.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

static int frees, host_frees;
static void *last_free;

EXPORT cudaError_t cudaGetDevice(int *device) {
  if (device == NULL)
    return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *devPtr) {
  frees++;
  last_free = devPtr;
  return cudaSuccess;
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  (void)hStream;
  return cudaFree(devPtr);
}

EXPORT cudaError_t cudaFreeHost(void *ptr) {
  host_frees++;
  last_free = ptr;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}

EXPORT cudaError_t cudaPeekAtLastError(void) {
  return cudaSuccess;
}

/* ---- captures: the driver's (the fake's, named by GCA_CUDA_LIBRARY) ---- */

static void *driver_fn(const char *name) {
  const char *lib = getenv("GCA_CUDA_LIBRARY");
  void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) : NULL;
  return h ? dlsym(h, name) : NULL;
}

static cudaError_t rt_of(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS:
    return cudaSuccess;
  case CUDA_ERROR_ILLEGAL_STATE:
    return cudaErrorIllegalState;
  case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    return cudaErrorStreamCaptureUnmatched;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    return cudaErrorStreamCaptureInvalidated;
  default:
    return cudaErrorUnknown;
  }
}

typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);
typedef CUresult (*status_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*to_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                                size_t, CUstreamCaptureMode);

/* Each runtime form, plain or per-thread-default-stream (_ptsz), calls the
 * driver's entry point `sym` of the same form. */
static cudaError_t begin_capture(const char *sym, cudaStream_t stream,
                                 enum cudaStreamCaptureMode mode) {
  begin_fn f = (begin_fn)(uintptr_t)driver_fn(sym);
  return f ? rt_of(f(stream, (CUstreamCaptureMode)mode)) : cudaErrorNotSupported;
}

static cudaError_t end_capture(const char *sym, cudaStream_t stream, cudaGraph_t *pGraph) {
  end_fn f = (end_fn)(uintptr_t)driver_fn(sym);
  return f ? rt_of(f(stream, (CUgraph *)pGraph)) : cudaErrorNotSupported;
}

static cudaError_t is_capturing(const char *sym, cudaStream_t stream,
                                enum cudaStreamCaptureStatus *pCaptureStatus) {
  status_fn f = (status_fn)(uintptr_t)driver_fn(sym);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cudaError_t e = f ? rt_of(f(stream, &st)) : cudaErrorNotSupported;
  *pCaptureStatus = (enum cudaStreamCaptureStatus)st;
  return e;
}

static cudaError_t begin_to_graph(const char *sym, cudaStream_t stream, cudaGraph_t graph,
                                  const cudaGraphNode_t *deps, const cudaGraphEdgeData *edges,
                                  size_t n, enum cudaStreamCaptureMode mode) {
  to_graph_fn f = (to_graph_fn)(uintptr_t)driver_fn(sym);
  return f ? rt_of(f(stream, (CUgraph)graph, (const CUgraphNode *)deps,
                     (const CUgraphEdgeData *)edges, n, (CUstreamCaptureMode)mode))
           : cudaErrorNotSupported;
}

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  return begin_capture("cuStreamBeginCapture_v2", stream, mode);
}
EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                               enum cudaStreamCaptureMode mode);
EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                               enum cudaStreamCaptureMode mode) {
  return begin_capture("cuStreamBeginCapture_ptsz", stream, mode);
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
  return end_capture("cuStreamEndCapture", stream, pGraph);
}
EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph) {
  return end_capture("cuStreamEndCapture_ptsz", stream, pGraph);
}

EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                         enum cudaStreamCaptureStatus *pCaptureStatus) {
  return is_capturing("cuStreamIsCapturing", stream, pCaptureStatus);
}
EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus *pCaptureStatus);
EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus *pCaptureStatus) {
  return is_capturing("cuStreamIsCapturing_ptsz", stream, pCaptureStatus);
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                 const cudaGraphNode_t *deps,
                                                 const cudaGraphEdgeData *edges, size_t n,
                                                 enum cudaStreamCaptureMode mode) {
  return begin_to_graph("cuStreamBeginCaptureToGraph", stream, graph, deps, edges, n, mode);
}
EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode);
EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode) {
  return begin_to_graph("cuStreamBeginCaptureToGraph_ptsz", stream, graph, deps, edges, n, mode);
}

/* ---- inspection ---- */

EXPORT int fake_cudart_frees(void);
EXPORT int fake_cudart_host_frees(void);
EXPORT void *fake_cudart_last_free(void);

/* Calls of cudaFree / cudaFreeAsync, of cudaFreeHost, and the pointer the
 * last of them was given. */
EXPORT int fake_cudart_frees(void) {
  return frees;
}
EXPORT int fake_cudart_host_frees(void) {
  return host_frees;
}
EXPORT void *fake_cudart_last_free(void) {
  return last_free;
}
