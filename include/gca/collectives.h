/* SPDX-License-Identifier: Apache-2.0 */
/* gca/collectives.h - communicators and stream-ordered collectives
 * (all-gather, reduce-scatter, all-reduce) over gca memory (DESIGN.md
 * "Collectives").
 *
 * A communicator is one rank of a group of nranks ranks that share a unique
 * id. Collectives are queued on a stream like kernels: they run in order
 * with the stream's other work, may be captured into a graph, and every rank
 * must issue the same collectives in the same order (as with NCCL).
 * Failures that only the run can see (a peer that never issues its part, a
 * sequence that differs between ranks, an abort) do not hang the stream: the
 * collective ends without writing its output and the communicator keeps the
 * error (gca_comm_async_error); later calls on it fail with it.
 *
 * Backends: "sim" (ranks as threads of one process on sim devices, or as
 * processes meeting in shared memory: gca_comm_options_t.sim_processes; a cost per collective of
 * latency plus bytes over bandwidth, so that overlap can be measured) and "nccl" (on the cuda
 * device backend: libnccl loaded at run time, GCA_NCCL_LIBRARY or
 * "libnccl.so.2", 2.10 or later; buffer registration needs 2.19). */
#ifndef GCA_COLLECTIVES_H
#define GCA_COLLECTIVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca/device.h"
#include "gca/pool.h"
#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gca_comm gca_comm_t; /* opaque */

#define GCA_COMM_ID_BYTES 128 /* as ncclUniqueId */
typedef struct gca_comm_id {
  unsigned char bytes[GCA_COMM_ID_BYTES];
} gca_comm_id_t;

typedef enum gca_comm_backend {
  GCA_COMM_BACKEND_AUTO = 0, /* sim on the sim device backend, nccl on the cuda one */
  GCA_COMM_BACKEND_SIM = 1,
  GCA_COMM_BACKEND_NCCL = 2,
} gca_comm_backend_t;

typedef struct gca_comm_options {
  size_t size; /* sizeof(gca_comm_options_t) */
  gca_comm_backend_t backend;
  double latency_us;     /* sim: cost of each collective (0: none) */
  double bandwidth_gbps; /* sim: bytes per ns moved by a collective (0: no byte cost) */
  double timeout_s;      /* how long a rank waits for its peers (create and collectives) */
  /* sim: the ranks are separate processes (each calls gca_comm_create with
   * the same id): they meet through a Unix socket named by the id and move
   * data through shared memory, in rounds of sim_chunk_bytes per rank
   * (0: 4 MiB; 64 KiB .. 1 GiB). False: the ranks are threads of this
   * process. */
  bool sim_processes;
  size_t sim_chunk_bytes;
} gca_comm_options_t;

#define GCA_COMM_SIM_CHUNK_DEFAULT ((size_t)4 << 20)
#define GCA_COMM_OPTIONS_INIT \
  { sizeof(gca_comm_options_t), GCA_COMM_BACKEND_AUTO, 0, 0, 30.0, false, 0 }

typedef enum gca_dtype {
  GCA_DTYPE_F32 = 0,
  GCA_DTYPE_F16 = 1,
  GCA_DTYPE_BF16 = 2,
  GCA_DTYPE_F64 = 3,
  GCA_DTYPE_I32 = 4,
  GCA_DTYPE_I64 = 5,
  GCA_DTYPE_U8 = 6,
} gca_dtype_t;

typedef enum gca_reduce_op {
  GCA_REDUCE_SUM = 0,
  GCA_REDUCE_PROD = 1,
  GCA_REDUCE_MAX = 2,
  GCA_REDUCE_MIN = 3,
  GCA_REDUCE_AVG = 4, /* floating dtypes only: the sum divided by nranks */
} gca_reduce_op_t;

/* A fresh id (ncclGetUniqueId on the cuda device backend, else random
 * bytes); every rank of a communicator uses the same. */
GCA_API gca_status_t gca_comm_get_unique_id(gca_comm_id_t *id);
/* Joins rank `rank` of `nranks` on `device`; returns once every rank has
 * joined (or fails after the timeout naming the ranks missing). */
GCA_API gca_status_t gca_comm_create(const gca_comm_id_t *id, int nranks, int rank, int device,
                                     const gca_comm_options_t *opts, gca_comm_t **comm);
/* All nranks ranks from one thread, rank r on devices[r] (as ncclCommInitAll).
 * On failure no communicator is left and every comms[r] is NULL. */
GCA_API gca_status_t gca_comm_create_all(int nranks, const int *devices,
                                         const gca_comm_options_t *opts, gca_comm_t **comms);
/* Waits for the communicator's queued collectives, then frees it. The handle
 * is dead afterwards (later calls: GCA_ERR_INVALID_HANDLE). */
GCA_API gca_status_t gca_comm_destroy(gca_comm_t *comm);
/* Fails the communicator's pending and future collectives on every rank at
 * once (peers waiting for this rank wake with the error) and frees it
 * without waiting. */
GCA_API gca_status_t gca_comm_abort(gca_comm_t *comm);
/* Wraps an ncclComm_t the caller already owns (rank and size read from it);
 * destroying the wrapper leaves the NCCL communicator alone. */
GCA_API gca_status_t gca_comm_wrap_nccl(void *nccl_comm, int device, gca_comm_t **comm);
/* Registers [ptr, ptr + bytes) with the communicator (ncclCommRegister; the
 * sim keeps and checks the range) for the collectives that use it. */
GCA_API gca_status_t gca_comm_register(gca_comm_t *comm, void *ptr, size_t bytes, void **handle);
GCA_API gca_status_t gca_comm_deregister(gca_comm_t *comm, void *handle);
GCA_API gca_status_t gca_comm_rank(const gca_comm_t *comm, int *rank);
GCA_API gca_status_t gca_comm_count(const gca_comm_t *comm, int *nranks);
GCA_API gca_status_t gca_comm_device(const gca_comm_t *comm, int *device);
GCA_API gca_status_t gca_comm_backend_of(const gca_comm_t *comm, gca_comm_backend_t *backend);
/* GCA_OK, or the error a collective met while it ran (its detail in
 * gca_last_error after the call). */
GCA_API gca_status_t gca_comm_async_error(gca_comm_t *comm);

typedef struct gca_comm_stats {
  size_t size;                  /* sizeof(gca_comm_stats_t) */
  uint64_t collectives;         /* issued on this rank */
  uint64_t bytes;               /* bytes this rank sent in them */
  uint64_t completed;           /* that ran to the end (sim) */
  uint64_t registrations;       /* live (gca_comm_register) */
  uint64_t registrations_total; /* made since creation */
  uint64_t deregistrations_total;
} gca_comm_stats_t;
GCA_API gca_status_t gca_comm_stats(const gca_comm_t *comm, gca_comm_stats_t *out);

/* recv (nranks * sendcount elements) = every rank's send, in rank order.
 * In place when send == recv + rank * sendcount elements. */
GCA_API gca_status_t gca_all_gather(const void *send, void *recv, size_t sendcount,
                                    gca_dtype_t dtype, gca_comm_t *comm, gca_stream_t stream);
/* recv (recvcount elements) = this rank's block of the reduction of every
 * rank's send (nranks * recvcount elements). In place when recv == send +
 * rank * recvcount elements. */
GCA_API gca_status_t gca_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                        gca_dtype_t dtype, gca_reduce_op_t op, gca_comm_t *comm,
                                        gca_stream_t stream);
/* recv (count elements) = the reduction of every rank's send. In place when
 * send == recv. Reductions run in rank order: in float for f16, bf16 and f32
 * (f16 and bf16 rounded to nearest even once), in double for f64, modulo 2^n
 * for integers. */
GCA_API gca_status_t gca_all_reduce(const void *send, void *recv, size_t count, gca_dtype_t dtype,
                                    gca_reduce_op_t op, gca_comm_t *comm, gca_stream_t stream);
/* A comm pool: a private pool (gca/pool.h) on the communicator's device
 * whose physical memory is registered with the communicator from the moment
 * the allocator creates or maps it until it is released or unmapped (one
 * registration per physical allocation; gca_comm_stats counts them), so
 * every allocation routed to it, whenever made, is registered memory and a
 * step that reuses cached blocks registers nothing. Route allocations to it
 * as to any private pool (gca_pool_use_begin, a filter, a capture); release
 * it with gca_pool_release. opts (may be NULL) must not name an observer. A
 * registration that fails fails the allocation that needed the memory. The
 * pool may outlive the communicator: its registrations die with it, and
 * allocations that would need new memory then fail. */
GCA_API gca_status_t gca_comm_pool_create(gca_comm_t *comm, const gca_pool_options_t *opts,
                                          gca_pool_t **pool);

/* Bracket collectives of several communicators issued by one thread (as
 * ncclGroupStart/End); they nest. The sim backend issues each at once (its
 * collectives never block the issuing thread). */
GCA_API gca_status_t gca_group_start(void);
GCA_API gca_status_t gca_group_end(void);

GCA_API size_t gca_dtype_size(gca_dtype_t dtype);

/* ---- the bucketer ----
 *
 * Collectives added in order are merged into buckets: adjacent ones with the
 * same communicator, kind, reduce op and dtype, up to a byte cap, never one
 * that depends on another in the same bucket (the caller names the earlier
 * collectives each depends on). Finalize fixes the layout: each bucket gets
 * one flat buffer (allocated once, registered with the communicator) and
 * each collective an offset in it, the same on every rank and every run;
 * the buffers come from a comm pool per communicator (registered memory). A
 * run copies the inputs in, runs one collective per bucket (all-gather in its
 * in-place form) and copies the outputs out, on one stream, each direction
 * one copy-batch kernel (gca_kernel_copy_batch) whose table is written at
 * finalize; a bucket of one collective runs it directly, unmerged. The
 * collectives' buffers must be device memory (the kernels touch them). */

typedef struct gca_bucketer gca_bucketer_t;

typedef enum gca_coll_kind {
  GCA_COLL_ALL_GATHER = 0,
  GCA_COLL_REDUCE_SCATTER = 1,
  GCA_COLL_ALL_REDUCE = 2,
} gca_coll_kind_t;

typedef struct gca_bucketer_options {
  size_t size;      /* sizeof(gca_bucketer_options_t) */
  size_t cap_bytes; /* a bucket's input bytes at most (default 2000 MB, as Inductor) */
} gca_bucketer_options_t;

#define GCA_BUCKETER_OPTIONS_INIT \
  { sizeof(gca_bucketer_options_t), (size_t)2000 << 20 }

GCA_API gca_status_t gca_bucketer_create(const gca_bucketer_options_t *opts,
                                         gca_bucketer_t **bucketer);
/* Adds the next collective (count as the collective's own call takes it);
 * deps: indices of earlier collectives whose output it reads. *index: its
 * index. */
GCA_API gca_status_t gca_bucketer_add(gca_bucketer_t *b, gca_comm_t *comm, gca_coll_kind_t kind,
                                      const void *send, void *recv, size_t count, gca_dtype_t dtype,
                                      gca_reduce_op_t op, const size_t *deps, size_t ndeps,
                                      size_t *index);
/* Plans the buckets and allocates their buffers (on the communicators'
 * devices, with gca_malloc on `stream`). Nothing can be added afterwards. */
GCA_API gca_status_t gca_bucketer_finalize(gca_bucketer_t *b, gca_stream_t stream);
/* Runs every collective once, bucketed, on `stream` (capturable). */
GCA_API gca_status_t gca_bucketer_run(gca_bucketer_t *b, gca_stream_t stream);
GCA_API gca_status_t gca_bucketer_bucket_count(const gca_bucketer_t *b, size_t *buckets);
/* Where collective `index` lives: its bucket, the bucket's buffer and the
 * collective's element offset in the bucket's input. */
GCA_API gca_status_t gca_bucketer_layout(const gca_bucketer_t *b, size_t index, size_t *bucket,
                                         void **buffer, size_t *offset);
/* Debug check (collective: every rank calls it, each on its own thread):
 * exchanges every rank's sequence and layout (per communicator: each
 * collective's kind, dtype, op, count, bucket and offset) and fails with
 * GCA_ERR_INVALID_STATE naming the first difference (the rank, the
 * collective's index, what differs and both values). Synchronizes `stream`. */
GCA_API gca_status_t gca_bucketer_check(gca_bucketer_t *b, gca_stream_t stream);
/* Bytes of the bucketer's comm pools: their segments (reserved) and the
 * bucket buffers allocated from them (live). After finalize. */
GCA_API gca_status_t gca_bucketer_memory(const gca_bucketer_t *b, size_t *reserved, size_t *live);
/* Waits for nothing: frees the buffers and releases the comm pools (their
 * memory is deregistered as it goes back); the caller synchronizes the
 * stream beforehand. */
GCA_API void gca_bucketer_destroy(gca_bucketer_t *b);

#ifdef __cplusplus
}
#endif
#endif
