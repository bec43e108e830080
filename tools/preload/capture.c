/* SPDX-License-Identifier: Apache-2.0 */
/* capture.c - the program's stream captures, counted for the allocator.
 *
 * Note [Captures under the shim]: while a capture runs in global mode the
 * driver refuses a device synchronize, and any synchronize or query from a
 * thread whose capture mode is not relaxed, and invalidates the capture for
 * it; the allocator makes such calls on its own account (a destroyed stream's
 * wait, pending frees' queries, releases), and keeps them clear of captures
 * through the capture gate (Note [Capture gate], allocator/device/device.c),
 * which knows the captures begun through gca's device table. A program under
 * the shim begins its captures through the runtime or the driver, which gca
 * never sees; so on the cuda backend the shim defines their begin and end
 * (cudaStreamBeginCapture, cudaStreamBeginCaptureToGraph,
 * cudaStreamEndCapture, cuStreamBeginCapture_v2, cuStreamBeginCaptureToGraph,
 * cuStreamEndCapture and their _ptsz forms) and counts each capture at the
 * gate before the real library begins it, as the backends do. A capture is
 * over once its stream no longer captures after an end, whatever the end
 * returned (an invalidated capture ends with an error), or when the program
 * destroys its stream. Only captures the shim counted are uncounted: a table
 * of their streams, keyed for the per-thread and legacy handles by thread as
 * well. A capture the program never ends keeps the gate closed: the allocator
 * then makes its queries in relaxed mode and leaves device-wide waits (a
 * destroyed stream's memory) for later. On sim the runtime is served by the
 * shim and has no graphs; these calls pass through.
 */
#include <pthread.h>
#include <stdint.h>

#include "common.h"
#include "device.h"
#include "shim.h"

/* Per-thread-default-stream forms (programs built with --default-stream
 * per-thread); the headers declare them only under that option. */
SHIM_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                 enum cudaStreamCaptureMode mode);
SHIM_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                        const cudaGraphNode_t *deps,
                                                        const cudaGraphEdgeData *edges, size_t n,
                                                        enum cudaStreamCaptureMode mode);
SHIM_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
SHIM_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream, CUstreamCaptureMode mode);
SHIM_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                   const CUgraphNode *deps,
                                                   const CUgraphEdgeData *edges, size_t n,
                                                   CUstreamCaptureMode mode);
SHIM_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus *st);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *st);

/* ---- the table of counted captures ---- */

typedef struct counted {
  CUstream stream;
  pthread_t thread; /* for a default stream's handle (NULL, legacy, per-thread): whose */
} counted_t;

/* Invariant (under lock): v[0, n) are the captures the shim counted in
 * gca__device_captures and has not uncounted, one entry per capture. A
 * program runs a few at a time; past GCA__SHIM_CAPTURES a capture begins
 * uncounted, as it would without the shim (logged). */
enum { GCA__SHIM_CAPTURES = 256 };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static counted_t v[GCA__SHIM_CAPTURES];
static size_t n;

static bool is_default(CUstream s) {
  return (uintptr_t)s <= 2; /* NULL, CU_STREAM_LEGACY (0x1), CU_STREAM_PER_THREAD (0x2) */
}

static bool same(const counted_t *c, CUstream s) {
  return c->stream == s && (!is_default(s) || pthread_equal(c->thread, pthread_self()));
}

/* Counts a capture about to begin on s at the gate; false (nothing counted)
 * when the table is full. */
static bool count_begin(CUstream s) {
  pthread_mutex_lock(&lock);
  if (n == GCA__SHIM_CAPTURES) {
    pthread_mutex_unlock(&lock);
    GCA_LOG_ERR("stream %p: %d captures run already; this one is not counted, and the "
                "allocator's own waits may invalidate it",
                (void *)s, (int)GCA__SHIM_CAPTURES);
    return false;
  }
  v[n++] = (counted_t){s, pthread_self()};
  pthread_mutex_unlock(&lock);
  gca__capture_enter();
  return true;
}

/* Uncounts the capture the shim counted on s, if any. */
static void uncount(CUstream s) {
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n && !found; i++)
    if (same(&v[i], s)) {
      v[i] = v[--n];
      found = true;
    }
  pthread_mutex_unlock(&lock);
  if (found)
    gca__capture_abandon();
}

void gca__shim_capture_forget(CUstream stream) {
  if (!is_default(stream))
    uncount(stream);
}

/* ---- begin ---- */

/* On sim the runtime has no graphs: the call passes through. */
#define BEGIN(ok, s, call)          \
  do {                              \
    if (gca__shim_on_sim())         \
      return (call);                \
    bool counted_ = count_begin(s); \
    __typeof__(call) r_ = (call);   \
    if (r_ != (ok) && counted_)     \
      uncount(s);                   \
    return r_;                      \
  } while (0)

#define CALL_RT(fn, ...)                                                    \
  ({                                                                        \
    __typeof__(&fn) real_ = REAL(fn);                                       \
    real_ ? real_(__VA_ARGS__) : gca__shim_rt_error(cudaErrorNotSupported); \
  })
#define CALL_DRV(fn, ...)                                  \
  ({                                                       \
    __typeof__(&fn) real_ = REAL(fn);                      \
    real_ ? real_(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED; \
  })

SHIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  BEGIN(cudaSuccess, stream, CALL_RT(cudaStreamBeginCapture, stream, mode));
}

SHIM_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                 enum cudaStreamCaptureMode mode) {
  BEGIN(cudaSuccess, stream, CALL_RT(cudaStreamBeginCapture_ptsz, stream, mode));
}

SHIM_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                   const cudaGraphNode_t *deps,
                                                   const cudaGraphEdgeData *edges, size_t k,
                                                   enum cudaStreamCaptureMode mode) {
  BEGIN(cudaSuccess, stream,
        CALL_RT(cudaStreamBeginCaptureToGraph, stream, graph, deps, edges, k, mode));
}

SHIM_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                        const cudaGraphNode_t *deps,
                                                        const cudaGraphEdgeData *edges, size_t k,
                                                        enum cudaStreamCaptureMode mode) {
  BEGIN(cudaSuccess, stream,
        CALL_RT(cudaStreamBeginCaptureToGraph_ptsz, stream, graph, deps, edges, k, mode));
}

SHIM_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  BEGIN(CUDA_SUCCESS, hStream, CALL_DRV(cuStreamBeginCapture_v2, hStream, mode));
}

SHIM_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  BEGIN(CUDA_SUCCESS, hStream, CALL_DRV(cuStreamBeginCapture_ptsz, hStream, mode));
}

SHIM_API CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                              const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                              size_t k, CUstreamCaptureMode mode) {
  BEGIN(CUDA_SUCCESS, hStream,
        CALL_DRV(cuStreamBeginCaptureToGraph, hStream, hGraph, deps, edges, k, mode));
}

SHIM_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                   const CUgraphNode *deps,
                                                   const CUgraphEdgeData *edges, size_t k,
                                                   CUstreamCaptureMode mode) {
  BEGIN(CUDA_SUCCESS, hStream,
        CALL_DRV(cuStreamBeginCaptureToGraph_ptsz, hStream, hGraph, deps, edges, k, mode));
}

/* ---- end ---- */

/* Whether the shim counted a capture on s. */
static bool counted(CUstream s) {
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n && !found; i++)
    found = same(&v[i], s);
  pthread_mutex_unlock(&lock);
  return found;
}

/* The capture on s is over once s no longer captures (or its status cannot
 * be read: an invalid stream captures nothing); asked only of a stream the
 * shim counted a capture on. */
static void rt_ended(cudaStream_t s, bool ptsz) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (!counted(s))
    return;
  cudaError_t e =
      ptsz ? CALL_RT(cudaStreamIsCapturing_ptsz, s, &st) : CALL_RT(cudaStreamIsCapturing, s, &st);
  if (e != cudaSuccess || st == cudaStreamCaptureStatusNone)
    uncount(s);
}

static void drv_ended(CUstream s, bool ptsz) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!counted(s))
    return;
  CUresult r =
      ptsz ? CALL_DRV(cuStreamIsCapturing_ptsz, s, &st) : CALL_DRV(cuStreamIsCapturing, s, &st);
  if (r != CUDA_SUCCESS || st == CU_STREAM_CAPTURE_STATUS_NONE)
    uncount(s);
}

/* The real end, then the count (nothing is counted on sim). */
#define END(call, ended)          \
  do {                            \
    __typeof__(call) r_ = (call); \
    if (!gca__shim_on_sim())      \
      ended;                      \
    return r_;                    \
  } while (0)

SHIM_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
  END(CALL_RT(cudaStreamEndCapture, stream, pGraph), rt_ended(stream, false));
}

SHIM_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph) {
  END(CALL_RT(cudaStreamEndCapture_ptsz, stream, pGraph), rt_ended(stream, true));
}

SHIM_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  END(CALL_DRV(cuStreamEndCapture, hStream, phGraph), drv_ended(hStream, false));
}

SHIM_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
  END(CALL_DRV(cuStreamEndCapture_ptsz, hStream, phGraph), drv_ended(hStream, true));
}
