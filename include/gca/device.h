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
/* Capacity of a sim device in bytes (default GCA_SIM_DEVICE_MEMORY, else
 * 16GiB). Fails with GCA_ERR_INVALID_STATE when more than `bytes` is in use. */
GCA_API gca_status_t gca_sim_set_capacity(int device, uint64_t bytes);
/* Physical bytes currently created on a sim device. */
GCA_API uint64_t gca_sim_used_bytes(int device);

#ifdef __cplusplus
}
#endif
#endif
