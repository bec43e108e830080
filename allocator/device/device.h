/* SPDX-License-Identifier: Apache-2.0 */
/* device.h - the device layer's operation table: everything the layers above
 * need from a GPU, behind one struct of function pointers with two backends,
 * cuda (the driver API, loaded at run time) and sim (a software GPU).
 *
 * The table is the testing seam (STYLE.md): tests may wrap or swap it. Every
 * operation has a name in GCA_DEVICE_OP_MAP; the sim backend counts calls and
 * injects faults by that name, and every failure's detail message starts with
 * it ("mem_map: ...") so the caller can tell which operation failed.
 *
 * Semantics follow the CUDA driver API entry named beside each op. Where the
 * driver returns an error the op returns the matching gca status:
 *   CUDA_ERROR_OUT_OF_MEMORY            -> GCA_ERR_OUT_OF_MEMORY
 *   CUDA_ERROR_INVALID_VALUE            -> GCA_ERR_INVALID_ARGUMENT
 *   CUDA_ERROR_INVALID_HANDLE           -> GCA_ERR_INVALID_HANDLE
 *   CUDA_ERROR_NOT_READY                -> GCA_ERR_NOT_READY
 *   CUDA_ERROR_NOT_SUPPORTED            -> GCA_ERR_NOT_SUPPORTED
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED  -> GCA_ERR_CAPTURE_UNSUPPORTED
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED  -> GCA_ERR_CAPTURE_INVALIDATED
 *   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT     -> GCA_ERR_CAPTURE_IMPLICIT
 *   CUDA_ERROR_STREAM_CAPTURE_UNMATCHED    -> GCA_ERR_CAPTURE_UNMATCHED
 *   CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD -> GCA_ERR_CAPTURE_WRONG_THREAD
 *   CUDA_ERROR_STREAM_CAPTURE_UNJOINED     -> GCA_ERR_CAPTURE_UNJOINED
 *   CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE   -> GCA_ERR_GRAPH_UPDATE
 *   CUDA_ERROR_NOT_PERMITTED               -> GCA_ERR_NOT_PERMITTED (e.g. a device call
 *                                             from a host function, Note [Host functions])
 *   CUDA_ERROR_NO_DEVICE / NOT_INITIALIZED -> GCA_ERR_NO_DEVICE
 *   CUDA_ERROR_ILLEGAL_ADDRESS             -> GCA_ERR_ILLEGAL_ADDRESS
 *   CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED -> GCA_ERR_INVALID_STATE
 *   CUDA_ERROR_PEER_ACCESS_UNSUPPORTED     -> GCA_ERR_NOT_SUPPORTED
 *   CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED -> GCA_ERR_INVALID_STATE
 *   CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED  -> GCA_ERR_INVALID_ARGUMENT
 *   anything else                       -> GCA_ERR_DRIVER (driver's error name in the detail)
 */
#ifndef GCA_DEVICE_INTERNAL_H
#define GCA_DEVICE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gca/device.h"

/* Capture sequences begun through the device table and not yet ended, on
 * any device: the backends count them, and so does the preload shim for a
 * program's own (Note [Captures under the shim], tools/preload/capture.c);
 * a capture begun straight through the driver otherwise is not seen. The
 * allocator reads it before anything that would synchronize a whole device,
 * which a live capture on any thread forbids (Note [Releases during a
 * capture], segment.c). */
extern _Atomic int gca__device_captures;

/* Note [Capture gate] (device.c). A call that a capture on another thread
 * forbids, made on the allocator's own account: gca__device_wait_enter says
 * whether it may be made now (then gca__device_wait_leave after it), or a
 * capture runs or is beginning (skip it). The backends count a capture with
 * gca__capture_enter before the driver begins it (gca__capture_abandon if it
 * did not begin); that waits for the calls inside the gate. */
bool gca__device_wait_enter(void);
void gca__device_wait_leave(void);
void gca__capture_enter(void);
void gca__capture_abandon(void);

/* Note [Destroyed streams] (allocator/streamkey.c): run before a stream is
 * destroyed through gca, so that the allocator never gives the driver that
 * handle again; set once an allocator exists, else NULL. */
extern void (*_Atomic gca__stream_retire_hook)(gca_stream_t stream);
/* Runs the hook for a created stream (not NULL or a special handle). */
void gca__stream_retire(gca_stream_t stream);

/* X(name): one entry per operation, in table order. */
#define GCA_DEVICE_OP_MAP(X)      \
  X(init)                         \
  X(device_count)                 \
  X(device_attr)                  \
  X(device_name)                  \
  X(device_can_access_peer)       \
  X(mem_get_info)                 \
  X(mem_alloc)                    \
  X(mem_free)                     \
  X(mem_granularity)              \
  X(mem_address_reserve)          \
  X(mem_address_free)             \
  X(mem_create)                   \
  X(mem_release)                  \
  X(mem_map)                      \
  X(mem_unmap)                    \
  X(mem_set_access)               \
  X(mem_export_fd)                \
  X(mem_import_fd)                \
  X(ctx_synchronize)              \
  X(stream_create)                \
  X(stream_destroy)               \
  X(stream_synchronize)           \
  X(stream_query)                 \
  X(stream_wait_event)            \
  X(event_create)                 \
  X(event_destroy)                \
  X(event_record)                 \
  X(event_query)                  \
  X(event_synchronize)            \
  X(event_elapsed)                \
  X(launch_host_func)             \
  X(memcpy_async)                 \
  X(memset_d8_async)              \
  X(memset_d32_async)             \
  X(kernel_fill_u32)              \
  X(kernel_add_u32)               \
  X(kernel_sleep)                 \
  X(stream_begin_capture)         \
  X(stream_end_capture)           \
  X(stream_capture_info)          \
  X(thread_exchange_capture_mode) \
  X(graph_node_count)             \
  X(graph_instantiate)            \
  X(graph_upload)                 \
  X(graph_launch)                 \
  X(graph_exec_update)            \
  X(graph_destroy)                \
  X(graph_exec_destroy)           \
  X(mem_export_fabric)            \
  X(mem_import_fabric)            \
  X(ctx_set_device)               \
  X(ctx_get_device)               \
  X(stream_get_device)            \
  X(kernel_philox_u32)            \
  X(ctx_enable_peer_access)       \
  X(kernel_copy_batch)            \
  X(host_alloc)                   \
  X(host_free)                    \
  X(host_register)                \
  X(host_unregister)              \
  X(kernel_gemm_f32)              \
  X(kernel_ew_f32)                \
  X(kernel_dot_f32)

typedef enum gca_dev_op {
#define GCA__OP_ENUM(name) GCA_OP_##name,
  GCA_DEVICE_OP_MAP(GCA__OP_ENUM)
#undef GCA__OP_ENUM
      GCA_OP_COUNT
} gca_dev_op_t;

/* Device attributes (values as the driver reports them). */
typedef enum gca_dev_attr {
  GCA_ATTR_CC_MAJOR,
  GCA_ATTR_CC_MINOR,
  GCA_ATTR_MULTIPROCESSOR_COUNT,
  GCA_ATTR_VMM_SUPPORTED,          /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
  GCA_ATTR_POSIX_FD_SUPPORTED,     /* ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
  GCA_ATTR_FABRIC_SUPPORTED,       /* ..._HANDLE_TYPE_FABRIC_SUPPORTED, if creatable */
  GCA_ATTR_MEMORY_POOLS_SUPPORTED, /* CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED */
  GCA_ATTR_UNIFIED_ADDRESSING,
} gca_dev_attr_t;

/* Bytes of a fabric handle (CUmemFabricHandle, CU_IPC_HANDLE_SIZE). */
#define GCA_FABRIC_HANDLE_LEN 64u

/* Stream and event flags, capture modes and status, gca_host_fn_t: gca/device.h. */

/* Result of graph_exec_update, numerically equal to CUgraphExecUpdateResult. */
typedef enum gca_graph_update_result {
  GCA_GRAPH_UPDATE_SUCCESS = 0,
  GCA_GRAPH_UPDATE_ERROR = 1,
  GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED = 2,
  GCA_GRAPH_UPDATE_NODE_TYPE_CHANGED = 3,
  GCA_GRAPH_UPDATE_FUNCTION_CHANGED = 4,
  GCA_GRAPH_UPDATE_PARAMETERS_CHANGED = 5,
  GCA_GRAPH_UPDATE_NOT_SUPPORTED = 6,
  GCA_GRAPH_UPDATE_UNSUPPORTED_FUNCTION_CHANGE = 7,
  GCA_GRAPH_UPDATE_ATTRIBUTES_CHANGED = 8,
} gca_graph_update_result_t;

/* cuGraphExecUpdate's CUgraphExecUpdateResultInfo, the same from both backends.
 * error_node_index is SIZE_MAX where the driver's errorNode is NULL: success,
 * and a node-count mismatch (TOPOLOGY_CHANGED). */
typedef struct gca_graph_update_info {
  gca_graph_update_result_t result;
  size_t error_node_index; /* index (capture order) of the first offending node, or SIZE_MAX */
  char reason[256];        /* human-readable, e.g. "node 3: memset became memcpy" */
} gca_graph_update_info_t;

typedef struct gca_device_ops {
  const char *name; /* "cuda" or "sim" */

  /* cuInit + symbol resolution; once-guarded, later calls return the first result. */
  gca_status_t (*init)(void);
  gca_status_t (*device_count)(int *count);
  gca_status_t (*device_attr)(int dev, gca_dev_attr_t attr, int *value);
  gca_status_t (*device_name)(int dev, char *name, size_t len);
  gca_status_t (*device_can_access_peer)(int dev, int peer, int *can);
  /* cuMemGetInfo: free and total bytes of `dev`. */
  gca_status_t (*mem_get_info)(int dev, size_t *free_bytes, size_t *total_bytes);

  /* Classic allocation: cuMemAlloc / cuMemFree. Pointers are 256-byte aligned at least. */
  gca_status_t (*mem_alloc)(int dev, size_t size, gca_devptr_t *out);
  gca_status_t (*mem_free)(int dev, gca_devptr_t ptr);

  /* VMM: cuMemGetAllocationGranularity (minimum, or recommended when `recommended`). */
  gca_status_t (*mem_granularity)(int dev, bool recommended, size_t *granularity);
  /* cuMemAddressReserve / cuMemAddressFree. size and alignment multiples of the granularity;
   * alignment 0 means the granularity. */
  gca_status_t (*mem_address_reserve)(int dev, size_t size, size_t alignment, gca_devptr_t *out);
  gca_status_t (*mem_address_free)(int dev, gca_devptr_t ptr, size_t size);
  /* cuMemCreate of pinned device memory on `dev`, exportable as a POSIX fd when
   * the device supports it, and as a fabric handle when it supports that too.
   * GCA_ERR_OUT_OF_MEMORY when capacity is exhausted. */
  gca_status_t (*mem_create)(int dev, size_t size, gca_memhandle_t *out);
  /* cuMemRelease: the memory is freed once no mapping refers to it. */
  gca_status_t (*mem_release)(gca_memhandle_t handle);
  /* cuMemMap / cuMemUnmap (ptr, size multiples of the granularity). Unmap may
   * span several mappings as long as it covers each whole. */
  gca_status_t (*mem_map)(gca_devptr_t ptr, size_t size, size_t offset, gca_memhandle_t handle);
  gca_status_t (*mem_unmap)(gca_devptr_t ptr, size_t size);
  /* cuMemSetAccess: read-write access for each device in devs[0..ndevs). */
  gca_status_t (*mem_set_access)(gca_devptr_t ptr, size_t size, const int *devs, int ndevs);
  /* cuMemExportToShareableHandle (POSIX fd; the caller owns and closes the fd) and
   * cuMemImportFromShareableHandle (the fd stays the caller's). */
  gca_status_t (*mem_export_fd)(gca_memhandle_t handle, int *fd);
  gca_status_t (*mem_import_fd)(int dev, int fd, gca_memhandle_t *out);

  /* cuCtxSynchronize on the device's primary context. */
  gca_status_t (*ctx_synchronize)(int dev);

  /* Streams: cuStreamCreateWithPriority / Destroy / Synchronize / Query (GCA_ERR_NOT_READY
   * while work is pending) / WaitEvent. A NULL stream is the legacy default stream of
   * the calling thread's current device (device 0 unless set by the layer above). */
  gca_status_t (*stream_create)(int dev, unsigned flags, int priority, gca_stream_t *out);
  gca_status_t (*stream_destroy)(gca_stream_t stream);
  gca_status_t (*stream_synchronize)(gca_stream_t stream);
  gca_status_t (*stream_query)(gca_stream_t stream);
  gca_status_t (*stream_wait_event)(gca_stream_t stream, gca_event_t event);

  /* Events: cuEventCreate / Destroy / Record / Query / Synchronize / ElapsedTime (ms). */
  gca_status_t (*event_create)(int dev, unsigned flags, gca_event_t *out);
  gca_status_t (*event_destroy)(gca_event_t event);
  gca_status_t (*event_record)(gca_event_t event, gca_stream_t stream);
  gca_status_t (*event_query)(gca_event_t event);
  gca_status_t (*event_synchronize)(gca_event_t event);
  gca_status_t (*event_elapsed)(gca_event_t start, gca_event_t end, float *ms);

  /* cuLaunchHostFunc: fn(user_data) runs on a host thread in stream order.
   * Note [Host functions]: fn must not call the device layer (cuda.h: "The host
   * function must not make any CUDA API calls"; the driver may answer
   * CUDA_ERROR_NOT_PERMITTED, the sim always does: GCA_ERR_NOT_PERMITTED), and
   * host functions of different streams may run one at a time, so fn must
   * never wait for another host function. */
  gca_status_t (*launch_host_func)(gca_stream_t stream, gca_host_fn_t fn, void *user_data);
  /* cuMemcpyAsync (unified addressing: either side may be host or device) and
   * cuMemsetD8Async / cuMemsetD32Async (count in elements). */
  gca_status_t (*memcpy_async)(gca_devptr_t dst, gca_devptr_t src, size_t bytes,
                               gca_stream_t stream);
  gca_status_t (*memset_d8_async)(gca_devptr_t dst, uint8_t value, size_t count,
                                  gca_stream_t stream);
  gca_status_t (*memset_d32_async)(gca_devptr_t dst, uint32_t value, size_t count,
                                   gca_stream_t stream);

  /* Ready-made kernels for tests and tools, capturable like any stream work:
   * fill: dst[i] = value + i * step; add: dst[i] = a[i] + b[i]; sleep: the
   * stream is busy for `ns` nanoseconds (slow work for ordering tests). */
  gca_status_t (*kernel_fill_u32)(gca_devptr_t dst, uint32_t value, uint32_t step, size_t count,
                                  gca_stream_t stream);
  gca_status_t (*kernel_add_u32)(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b, size_t count,
                                 gca_stream_t stream);
  gca_status_t (*kernel_sleep)(uint64_t ns, gca_stream_t stream);

  /* Stream capture: cuStreamBeginCapture_v2 / cuStreamEndCapture /
   * cuStreamGetCaptureInfo (id may be NULL) / cuThreadExchangeStreamCaptureMode. */
  gca_status_t (*stream_begin_capture)(gca_stream_t stream, gca_capture_mode_t mode);
  gca_status_t (*stream_end_capture)(gca_stream_t stream, gca_graph_t *graph);
  gca_status_t (*stream_capture_info)(gca_stream_t stream, gca_capture_status_t *status,
                                      uint64_t *id);
  gca_status_t (*thread_exchange_capture_mode)(gca_capture_mode_t *mode);

  /* Graphs: cuGraphGetNodes (count) / cuGraphInstantiate / cuGraphUpload / cuGraphLaunch /
   * cuGraphExecUpdate (GCA_ERR_GRAPH_UPDATE with *info filled when rejected) /
   * cuGraphDestroy / cuGraphExecDestroy. */
  gca_status_t (*graph_node_count)(gca_graph_t graph, size_t *count);
  gca_status_t (*graph_instantiate)(gca_graph_t graph, gca_graph_exec_t *out);
  gca_status_t (*graph_upload)(gca_graph_exec_t exec, gca_stream_t stream);
  gca_status_t (*graph_launch)(gca_graph_exec_t exec, gca_stream_t stream);
  gca_status_t (*graph_exec_update)(gca_graph_exec_t exec, gca_graph_t graph,
                                    gca_graph_update_info_t *info);
  gca_status_t (*graph_destroy)(gca_graph_t graph);
  gca_status_t (*graph_exec_destroy)(gca_graph_exec_t exec);

  /* cuMemExportToShareableHandle / cuMemImportFromShareableHandle with
   * CU_MEM_HANDLE_TYPE_FABRIC: GCA_FABRIC_HANDLE_LEN opaque bytes that name the
   * allocation across nodes of one NVLink fabric (where an fd cannot go). Only
   * memory created while the device reports GCA_ATTR_FABRIC_SUPPORTED can be
   * exported; GCA_ERR_NOT_SUPPORTED on devices (and the sim) without it. On
   * cuda that attribute is the driver's confirmed by creating memory with
   * fabric handles: a driver that reports them but refuses to make them (no
   * IMEX channel) answers 0 (Note [Fabric handles]). */
  gca_status_t (*mem_export_fabric)(gca_memhandle_t handle, uint8_t out[GCA_FABRIC_HANDLE_LEN]);
  gca_status_t (*mem_import_fabric)(int dev, const uint8_t in[GCA_FABRIC_HANDLE_LEN],
                                    gca_memhandle_t *out);

  /* The calling thread's current device, which a NULL stream refers to:
   * cuCtxSetCurrent(primary context of dev) / cuCtxGetDevice (the device last
   * set, even after ops naming another device switched the driver's context).
   * Per thread; a thread that never set one is on device 0.
   * GCA_ERR_INVALID_ARGUMENT for a device index out of range. */
  gca_status_t (*ctx_set_device)(int dev);
  gca_status_t (*ctx_get_device)(int *dev);
  /* The device a stream belongs to: cuStreamGetCtx and that context's device;
   * NULL is the calling thread's current device (its legacy stream).
   * GCA_ERR_INVALID_HANDLE for a stream that is not live. */
  gca_status_t (*stream_get_device)(gca_stream_t stream, int *dev);

  /* Ready-made RNG kernel (common/philox.h, Note [Philox stream]): dst[0..count)
   * = Philox4x32-10 numbers for the seed *(u64 *)seed_ptr and the offset
   * *(u64 *)offset_ptr + offset_add, both read when the kernel runs, so a
   * captured launch draws from whatever the scalars hold at replay. The three
   * pointers are device pointers, dst 4-byte and the scalars 8-byte aligned. */
  gca_status_t (*kernel_philox_u32)(gca_devptr_t dst, size_t count, gca_devptr_t seed_ptr,
                                    gca_devptr_t offset_ptr, uint64_t offset_add,
                                    gca_stream_t stream);

  /* cuCtxEnablePeerAccess from dev's primary context to peer's: kernels and
   * memsets on dev's streams may then touch peer's classic (mem_alloc) memory
   * (copies may without it: the driver stages them through the host). One way;
   * VMM memory is granted per range by mem_set_access instead.
   * GCA_ERR_INVALID_STATE when already enabled, GCA_ERR_INVALID_ARGUMENT when
   * dev == peer (CUDA_ERROR_INVALID_CONTEXT), GCA_ERR_NOT_SUPPORTED when
   * device_can_access_peer(dev, peer) says no. */
  gca_status_t (*ctx_enable_peer_access)(int dev, int peer);

  /* A batch of copies in one kernel: `table` is device memory holding n
   * gca_copy_entry_t (gca/device.h), read when the kernel runs, so a table
   * written once serves every launch and graph replay. Entries run in any
   * order, at once: no destination may overlap another entry's source or
   * destination. Both sides of every entry are device memory the stream's
   * device may touch (else the kernel faults: GCA_ERR_ILLEGAL_ADDRESS at the
   * next synchronize). GCA_ERR_INVALID_ARGUMENT for a table that is not
   * 8-byte aligned (n > 0). */
  gca_status_t (*kernel_copy_batch)(gca_devptr_t table, size_t n, gca_stream_t stream);
  /* Pinned (page-locked) host memory, which copies use without staging
   * (Note [Sim copies]). cuMemHostAlloc with CU_MEMHOSTALLOC_PORTABLE (pinned
   * for every context): `size` > 0 bytes, page aligned; GCA_ERR_OUT_OF_MEMORY
   * when it cannot be allocated or pinned. cuMemFreeHost: `ptr` exactly as
   * host_alloc returned it, else GCA_ERR_INVALID_ARGUMENT. */
  gca_status_t (*host_alloc)(size_t size, void **out);
  gca_status_t (*host_free)(void *ptr);
  /* cuMemHostRegister (CU_MEMHOSTREGISTER_PORTABLE): page-locks the existing
   * host memory [ptr, ptr+size); GCA_ERR_INVALID_STATE when a byte of it is
   * pinned already, GCA_ERR_INVALID_ARGUMENT when it is not host memory,
   * GCA_ERR_OUT_OF_MEMORY when it cannot be pinned. cuMemHostUnregister:
   * `ptr` is the base of a registered range, else GCA_ERR_INVALID_ARGUMENT. */
  gca_status_t (*host_register)(void *ptr, size_t size);
  gca_status_t (*host_unregister)(void *ptr);

  /* The f32 compute kernels of gca/device.h (gca_kernel_gemm_f32,
   * gca_kernel_ew_f32, gca_kernel_dot_f32), with their semantics and the
   * summation order of Note [Compute order]. Both backends check the
   * arguments with compute.c before anything is queued
   * (GCA_ERR_INVALID_ARGUMENT, nothing queued); memory that is not mapped
   * faults when the kernel runs (GCA_ERR_ILLEGAL_ADDRESS at the next
   * synchronize). */
  gca_status_t (*kernel_gemm_f32)(gca_devptr_t c, gca_devptr_t a, gca_devptr_t b, uint32_t m,
                                  uint32_t n, uint32_t k, uint32_t flags, gca_stream_t stream);
  gca_status_t (*kernel_ew_f32)(gca_ew_op_t op, gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                                float s, uint32_t u, size_t count, gca_stream_t stream);
  gca_status_t (*kernel_dot_f32)(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b, size_t count,
                                 float s, gca_stream_t stream);
} gca_device_ops_t;

/* Retires `stream` (the hook), then destroys it through `ops`: the way every
 * part of gca destroys a stream. */
gca_status_t gca__stream_destroy_retired(const gca_device_ops_t *ops, gca_stream_t stream);

/* ---- compute.c ----
 *
 * Note [Compute order]: the compute kernels fix the order of their f32
 * arithmetic, and round every product and every sum on its own (no fused
 * multiply-add: the sim's sources build with -ffp-contract=off, the PTX uses
 * mul.rn / add.rn, which ptxas never fuses), so each backend repeats its
 * results bit for bit and the two backends agree:
 *   - gemm: one sum per C element, from +0, adding op(A)(i,p) * op(B)(p,j) for
 *     p = 0 .. k-1 in turn; with GCA_GEMM_ACCUMULATE the old C is added last.
 *   - ew: one expression per element, as gca/device.h writes it.
 *   - dot: GCA__DOT_LANES partial sums (lane j adds the products j, j + LANES,
 *     j + 2 LANES, ... in turn from +0), then a pairwise tree (lane j +=
 *     lane j + h for h = LANES/2, ..., 1), then s times lane 0. The cuda
 *     kernel is one block of LANES threads, one lane each. */
#define GCA__DOT_LANES 256u

/* Bytes a compute kernel touches through each of its pointers (0: none). */
typedef struct gca__compute_span {
  size_t dst, a, b;
} gca__compute_span_t;

/* The spans of arguments that passed the checks below. */
gca__compute_span_t gca__gemm_f32_span(uint32_t m, uint32_t n, uint32_t k, uint32_t flags);
gca__compute_span_t gca__ew_f32_span(gca_ew_op_t op, size_t count);
gca__compute_span_t gca__dot_f32_span(size_t count);
/* Whether an elementwise op reads b (the unary ones do not). */
bool gca__ew_reads_b(gca_ew_op_t op);
/* Checks a compute kernel's arguments (flags, op, sizes, pointers,
 * overlaps); GCA_OK with *span filled, else GCA_ERR_INVALID_ARGUMENT whose
 * detail starts with the op's name ("kernel_gemm_f32: ...") and names the
 * argument. */
gca_status_t gca__check_gemm_f32(gca_devptr_t c, gca_devptr_t a, gca_devptr_t b, uint32_t m,
                                 uint32_t n, uint32_t k, uint32_t flags, gca__compute_span_t *span);
gca_status_t gca__check_ew_f32(gca_ew_op_t op, gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                               size_t count, gca__compute_span_t *span);
gca_status_t gca__check_dot_f32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b, size_t count,
                                gca__compute_span_t *span);

/* ---- device.c ---- */

/* The selected backend's table after gca_device_init() succeeded; NULL before. */
const gca_device_ops_t *gca__device(void);
/* Initializes (as gca_device_init) and returns the table, or NULL with the status in *st. */
const gca_device_ops_t *gca__device_get(gca_status_t *st);
/* Name of op `op` ("mem_map"). */
const char *gca__device_op_name(gca_dev_op_t op);
/* Tests: force the table returned by gca__device() (NULL undoes it). */
void gca__device_override(const gca_device_ops_t *ops);

/* ---- sim/sim.c, cuda/cuda.c ---- */

/* The backends' tables. The cuda table exists in every build; without cuda.h
 * at build time its init fails with GCA_ERR_NOT_SUPPORTED saying so. */
const gca_device_ops_t *gca__sim_ops(void);
const gca_device_ops_t *gca__cuda_ops(void);
/* The definition of `name` in the driver library the cuda backend loaded
 * (dlsym on its handle, so never a preloaded library's); NULL when the backend
 * has not initialized successfully (it does not start init) or when the
 * library has no such symbol. */
void *gca__cuda_driver_symbol(const char *name);

/* Note [Sim virtual time] (sim/sim_stream.c): where the sim backend keeps
 * virtual time (GCA_SIM_CLOCK=virtual), the clock (ns) of the stream whose
 * host function calls this, and a later time to move it to; for the layers
 * above, which model costs on streams (the sim collectives). Elsewhere
 * virtual is false and advance does nothing. */
bool gca__device_virtual_clock(void);
uint64_t gca__device_clock_now(void);
void gca__device_clock_advance_to(uint64_t vt);

/* Note [Capture gate] (device.c): sets the calling thread's capture mode to
 * relaxed for a call the allocator makes for itself while a capture may run
 * on another thread (*mode keeps the old one); false when it could not. */
static inline bool gca__relax(const gca_device_ops_t *ops, gca_capture_mode_t *mode) {
  *mode = GCA_CAPTURE_MODE_RELAXED;
  return ops->thread_exchange_capture_mode(mode) == GCA_OK;
}

static inline void gca__unrelax(const gca_device_ops_t *ops, bool relaxed,
                                gca_capture_mode_t mode) {
  if (relaxed)
    (void)ops->thread_exchange_capture_mode(&mode);
}

#endif
