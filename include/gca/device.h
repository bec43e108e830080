/* SPDX-License-Identifier: Apache-2.0 */
/* gca/device.h - the device handles gca passes through its API, backend
 * selection, and control of the sim backend (a software GPU used for tests and
 * tools on machines without one).
 *
 * Handle types share their struct tags with cuda.h (CUstream_st, ...), so a
 * gca_stream_t is a CUstream / cudaStream_t and converts without a cast when
 * both headers are included. Device pointers are CUdeviceptr-sized integers.
 */
#ifndef GCA_DEVICE_H
#define GCA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t gca_devptr_t;                   /* CUdeviceptr */
typedef uint64_t gca_memhandle_t;                /* CUmemGenericAllocationHandle */
typedef struct CUstream_st *gca_stream_t;        /* CUstream, cudaStream_t; NULL = legacy stream */
typedef struct CUevent_st *gca_event_t;          /* CUevent, cudaEvent_t */
typedef struct CUgraph_st *gca_graph_t;          /* CUgraph, cudaGraph_t */
typedef struct CUgraphExec_st *gca_graph_exec_t; /* CUgraphExec, cudaGraphExec_t */

typedef enum gca_backend_kind {
  GCA_BACKEND_AUTO = 0,
  GCA_BACKEND_CUDA = 1,
  GCA_BACKEND_SIM = 2,
} gca_backend_kind_t;

/* Initializes the device layer once (GCA_DEVICE=cuda|sim|auto; auto picks cuda
 * when a driver and a device are present, else sim, and says so once on
 * stderr). Later calls return the first call's result. */
GCA_API gca_status_t gca_device_init(void);
/* "cuda" or "sim" once initialized, else NULL. */
GCA_API const char *gca_device_backend_name(void);
GCA_API gca_status_t gca_device_count(int *count);

/* ---- the device API over the active backend ----
 *
 * Streams, events, copies, memsets, the sim's ready-made kernels and stream
 * capture on whichever backend gca_device_init() selected (each call
 * initializes the device layer first). Each function names the CUDA driver
 * call it corresponds to and keeps its semantics. A NULL stream is the legacy
 * default stream of the calling thread's current device (gca_set_device in
 * gca/allocator.h; device 0 unless set). Pointers use unified addressing:
 * either side of a copy may be host or device memory.
 *
 * Errors: a NULL out-pointer or unknown flag bits are GCA_ERR_INVALID_ARGUMENT
 * before the backend is called; a backend failure keeps its status and its
 * detail, which names the device operation ("stream_query: ..."), prefixed
 * with the public function's name ("gca_stream_query: stream_query: ...").
 */

/* Note [Special streams]: the two implicit streams a program may name by
 * handle, accepted by every op that takes a stream, numerically equal to the
 * driver's: CU_STREAM_LEGACY (the legacy default stream of the calling
 * thread's current device, the same as NULL) and CU_STREAM_PER_THREAD (the
 * calling thread's own default stream of that device: a blocking stream that
 * synchronizes with the legacy stream but not with other streams, one per
 * thread and device). Neither can be destroyed. A layer that keys state by
 * stream must not treat GCA_STREAM_PER_THREAD as one stream shared by threads. */
#define GCA_STREAM_LEGACY        ((gca_stream_t)(uintptr_t)0x1)
#define GCA_STREAM_PER_THREAD    ((gca_stream_t)(uintptr_t)0x2)
#define GCA_STREAM_IS_SPECIAL(s) ((s) == GCA_STREAM_LEGACY || (s) == GCA_STREAM_PER_THREAD)

/* Stream flags (CU_STREAM_*). */
#define GCA_STREAM_DEFAULT      0x0u
#define GCA_STREAM_NON_BLOCKING 0x1u
/* Event flags (CU_EVENT_*). */
#define GCA_EVENT_DEFAULT        0x0u
#define GCA_EVENT_BLOCKING_SYNC  0x1u
#define GCA_EVENT_DISABLE_TIMING 0x2u

/* Capture modes and status, numerically equal to CUstreamCaptureMode/Status. */
typedef enum gca_capture_mode {
  GCA_CAPTURE_MODE_GLOBAL = 0,
  GCA_CAPTURE_MODE_THREAD_LOCAL = 1,
  GCA_CAPTURE_MODE_RELAXED = 2,
} gca_capture_mode_t;

typedef enum gca_capture_status {
  GCA_CAPTURE_STATUS_NONE = 0,
  GCA_CAPTURE_STATUS_ACTIVE = 1,
  GCA_CAPTURE_STATUS_INVALIDATED = 2,
} gca_capture_status_t;

/* A host function run in stream order (CUhostFn). */
typedef void (*gca_host_fn_t)(void *user_data);

/* cuStreamCreate on the current device; flags GCA_STREAM_*. */
GCA_API gca_status_t gca_stream_create(gca_stream_t *stream, unsigned flags);
/* cuStreamDestroy: work already queued still runs. When gca's allocator
 * holds memory allocated or recorded on the stream, this first waits for the
 * stream's work, so that the allocator never names the destroyed handle to
 * the driver again (a stream destroyed straight through the driver must
 * outlive the memory allocated or recorded on it). */
GCA_API gca_status_t gca_stream_destroy(gca_stream_t stream);
/* cuStreamSynchronize. */
GCA_API gca_status_t gca_stream_synchronize(gca_stream_t stream);
/* cuStreamQuery: GCA_OK when all queued work is done, GCA_ERR_NOT_READY while
 * some is pending (the detail then says what is pending). */
GCA_API gca_status_t gca_stream_query(gca_stream_t stream);
/* cuStreamWaitEvent: later work on `stream` waits for `event`'s last record. */
GCA_API gca_status_t gca_stream_wait_event(gca_stream_t stream, gca_event_t event);
/* cuLaunchHostFunc: fn(user_data) runs on a host thread in stream order; it
 * must not call the device API. */
GCA_API gca_status_t gca_launch_host_func(gca_stream_t stream, gca_host_fn_t fn, void *user_data);

/* cuEventCreate on the current device; flags GCA_EVENT_*. */
GCA_API gca_status_t gca_event_create(gca_event_t *event, unsigned flags);
/* cuEventDestroy. */
GCA_API gca_status_t gca_event_destroy(gca_event_t event);
/* cuEventRecord: the event completes when the work queued on `stream` so far has. */
GCA_API gca_status_t gca_event_record(gca_event_t event, gca_stream_t stream);
/* cuEventSynchronize. */
GCA_API gca_status_t gca_event_synchronize(gca_event_t event);
/* cuEventQuery: GCA_OK once complete (or never recorded), GCA_ERR_NOT_READY
 * before. */
GCA_API gca_status_t gca_event_query(gca_event_t event);
/* cuEventElapsedTime: milliseconds from `start` to `end`, both complete and
 * created without GCA_EVENT_DISABLE_TIMING. */
GCA_API gca_status_t gca_event_elapsed_time(float *ms, gca_event_t start, gca_event_t end);

/* cuMemcpy: copies `bytes` from src to dst on the legacy stream of the current
 * device and returns when the copy is done. */
GCA_API gca_status_t gca_memcpy(void *dst, const void *src, size_t bytes);
/* cuMemcpyAsync: the copy runs in order on `stream`. */
GCA_API gca_status_t gca_memcpy_async(void *dst, const void *src, size_t bytes,
                                      gca_stream_t stream);
/* cuMemsetD8 / cuMemsetD32 (count in elements; dst 4-byte aligned for D32),
 * on the legacy stream, returning when done. */
GCA_API gca_status_t gca_memset_d8(void *dst, uint8_t value, size_t count);
GCA_API gca_status_t gca_memset_d32(void *dst, uint32_t value, size_t count);
/* cuMemsetD8Async / cuMemsetD32Async. */
GCA_API gca_status_t gca_memset_d8_async(void *dst, uint8_t value, size_t count,
                                         gca_stream_t stream);
GCA_API gca_status_t gca_memset_d32_async(void *dst, uint32_t value, size_t count,
                                          gca_stream_t stream);

/* cuCtxSynchronize on the current device: waits for all of its streams. */
GCA_API gca_status_t gca_device_synchronize(void);
/* cuMemGetInfo on the current device. */
GCA_API gca_status_t gca_mem_get_info(size_t *free_bytes, size_t *total_bytes);
/* cuDeviceGetName for `device` into name[0..len). */
GCA_API gca_status_t gca_device_name(int device, char *name, size_t len);

/* Ready-made kernels (the sim runs them; on cuda they are small PTX kernels),
 * queued on `stream` and capturable like any stream work:
 * fill: dst[i] = value + i * step for i < count; add: dst[i] = a[i] + b[i];
 * sleep: the stream is busy for `ns` nanoseconds. */
GCA_API gca_status_t gca_kernel_fill_u32(void *dst, uint32_t value, uint32_t step, size_t count,
                                         gca_stream_t stream);
GCA_API gca_status_t gca_kernel_add_u32(void *dst, const void *a, const void *b, size_t count,
                                        gca_stream_t stream);
GCA_API gca_status_t gca_kernel_sleep(uint64_t ns, gca_stream_t stream);

/* One copy of a batch: bytes from src to dst, both device memory. */
typedef struct gca_copy_entry {
  uint64_t dst, src, bytes;
} gca_copy_entry_t;
/* Copies a batch in one kernel: `table` (device memory, 8-byte aligned)
 * holds n entries, read when the kernel runs, so one table serves every
 * launch and replay. Entries run in any order, at once: no destination may
 * overlap another entry's source or destination. */
GCA_API gca_status_t gca_kernel_copy_batch(const void *table, size_t n, gca_stream_t stream);

/* ---- f32 compute kernels ----
 *
 * Small real kernels for training steps, queued on `stream` and capturable
 * like the kernels above. Every product and every sum is rounded to f32 on its
 * own (never a fused multiply-add), in the order stated for each kernel, so a
 * result is the same on every run, and the same on the sim and cuda backends
 * (NaN payloads aside). Operands are device memory, 4-byte aligned; a pointer
 * may be NULL only where nothing is read or written through it. Bad arguments
 * (unknown op or flag bits, a misaligned or NULL pointer, sizes whose bytes
 * overflow size_t, forbidden overlaps) are GCA_ERR_INVALID_ARGUMENT naming the
 * argument, and nothing is queued. */

/* Row-major f32 matrix product on `stream`: C (m x n) = op(A) . op(B), or
 * C += op(A) . op(B) with GCA_GEMM_ACCUMULATE. op(A) is m x k: A is m x k, or
 * k x m read transposed with GCA_GEMM_TRANS_A; op(B) is k x n: B is k x n, or
 * n x k with GCA_GEMM_TRANS_B. Each element sums its k products in order
 * p = 0, 1, ..., k-1 starting from +0 (then adds the old C when accumulating),
 * so results are the same on every run. Pointers 4-byte aligned; C must not
 * overlap A or B. m, n or k of 0: nothing to do (k = 0 without ACCUMULATE
 * writes zeros). */
enum { GCA_GEMM_TRANS_A = 1u, GCA_GEMM_TRANS_B = 2u, GCA_GEMM_ACCUMULATE = 4u };
GCA_API gca_status_t gca_kernel_gemm_f32(void *c, const void *a, const void *b, uint32_t m,
                                         uint32_t n, uint32_t k, uint32_t flags,
                                         gca_stream_t stream);

/* Elementwise f32 on `stream`, dst[i] for i < count (dst may equal a or b,
 * but not overlap them otherwise):
 *   ADD: a + b;  SUB: a - b;  MUL: a * b;  AXPY: a + s * b;  SCALE: s * a;
 *   RELU: a > 0 ? a : 0 (max(a, 0), NaN gives 0);
 *   RELU_GRAD: b > 0 ? a : 0 (a: the gradient, b: the input of the relu);
 *   DROPOUT: ((const uint32_t *)b)[i] < threshold ? 0 : a * s, where
 *   threshold = u (b holds random uint32 words, e.g. from
 *   gca_graph_rng_uniform_u32; the same words give the same mask, so backward
 *   applies DROPOUT to the gradient with the forward's words; u = 0 keeps
 *   every element, scaled by s).
 * Unary ops (SCALE, RELU) ignore b (may be NULL). The values are fixed (the
 * cuda kernel switches on them). */
typedef enum gca_ew_op {
  GCA_EW_ADD = 0,
  GCA_EW_SUB = 1,
  GCA_EW_MUL = 2,
  GCA_EW_AXPY = 3,
  GCA_EW_SCALE = 4,
  GCA_EW_RELU = 5,
  GCA_EW_RELU_GRAD = 6,
  GCA_EW_DROPOUT = 7,
} gca_ew_op_t;
GCA_API gca_status_t gca_kernel_ew_f32(gca_ew_op_t op, void *dst, const void *a, const void *b,
                                       float s, uint32_t u, size_t count, gca_stream_t stream);

/* dst[0] = s * sum over i < count of a[i] * b[i] (f32), summed in a fixed order
 * that depends only on count: 256 partial sums, partial j adding the products
 * i = j, j + 256, j + 512, ... in turn from +0, then halved pairwise
 * (partial j += partial j + h for h = 128, 64, ..., 1). count 0 writes s * 0.
 * dst may lie inside a or b (it is written after every read). */
GCA_API gca_status_t gca_kernel_dot_f32(void *dst, const void *a, const void *b, size_t count,
                                        float s, gca_stream_t stream);

/* cuStreamBeginCapture_v2 / cuStreamEndCapture (the captured graph into *graph). */
GCA_API gca_status_t gca_stream_begin_capture(gca_stream_t stream, gca_capture_mode_t mode);
GCA_API gca_status_t gca_stream_end_capture(gca_stream_t stream, gca_graph_t *graph);
/* cuStreamGetCaptureInfo: whether `stream` is capturing. */
GCA_API gca_status_t gca_stream_capture_status(gca_stream_t stream, gca_capture_status_t *status);
/* cuGraphInstantiate / cuGraphLaunch / cuGraphDestroy / cuGraphExecDestroy. */
GCA_API gca_status_t gca_graph_instantiate(gca_graph_exec_t *exec, gca_graph_t graph);
GCA_API gca_status_t gca_graph_launch(gca_graph_exec_t exec, gca_stream_t stream);
GCA_API gca_status_t gca_graph_destroy(gca_graph_t graph);
GCA_API gca_status_t gca_graph_exec_destroy(gca_graph_exec_t exec);

/* ---- sim backend control (valid whatever backend is selected; they act on
 * the sim's state) ---- */

/* Fault injection, same syntax as GCA_SIM_FAULTS: a comma-separated list of
 * `op:rule` where rule is `nth=N` (the N-th call from now fails once),
 * `every=K` (every K-th call fails), `after_bytes=B` (memory-creating calls
 * fail once B bytes have been created from now), or `always`. Ops are the
 * names listed by gca_sim_op_name(). An unknown op or rule is GCA_ERR_CONFIG
 * quoting the text; nothing is changed then. */
GCA_API gca_status_t gca_sim_fault_set(const char *spec);
GCA_API void gca_sim_fault_clear(void);
/* Number of device operations the sim knows; names for i in [0, count). */
GCA_API int gca_sim_op_count(void);
GCA_API const char *gca_sim_op_name(int op);
/* Calls of `op` (a name from gca_sim_op_name) since start or the last reset;
 * -1 for an unknown name. Counts every call, failed ones included. */
GCA_API int64_t gca_sim_call_count(const char *op);
GCA_API void gca_sim_counters_reset(void);
/* Makes every later call of `op` take `ns` nanoseconds longer (0: none), as a
 * real driver's cuMemAlloc takes a millisecond or so; the op acts after the
 * wait, and its call is counted before it. Unknown op: GCA_ERR_CONFIG. */
GCA_API gca_status_t gca_sim_set_latency(const char *op, uint64_t ns);
/* While held, every call of `op` is counted and then waits, before it acts,
 * until gca_sim_hold(op, false): a test's gate for "a thread is inside this
 * driver call" (gca_sim_call_count says when it got there), with no timing.
 * Unknown op: GCA_ERR_CONFIG. */
GCA_API gca_status_t gca_sim_hold(const char *op, bool hold);
/* Capacity of a sim device in bytes (default GCA_SIM_DEVICE_MEMORY, else
 * 16GiB). Fails with GCA_ERR_INVALID_STATE when more than `bytes` is in use. */
GCA_API gca_status_t gca_sim_set_capacity(int device, uint64_t bytes);
/* Physical bytes currently created on a sim device. */
GCA_API uint64_t gca_sim_used_bytes(int device);

#ifdef __cplusplus
}
#endif
#endif
