/* SPDX-License-Identifier: Apache-2.0 */
/* coll_internal.h - the collectives layer's internals.
 *
 * Module map: comm.c holds communicators (the registry of live handles, ids
 * and cliques of ranks, argument checks) and issues collectives as stream
 * work; sim_run.c runs one collective on a rank when its stream reaches it
 * (the rendezvous of the ranks, the data exchange, the cost model);
 * sim_proc.c lets ranks that are processes find each other and share the
 * memory they meet in; comm_pool.c has the comm pools; reduce.c
 * has the element types and reductions; nccl.c is the NCCL backend (libnccl
 * loaded at run time); bucket.c the bucketer. */
#ifndef GCA_COLL_INTERNAL_H
#define GCA_COLL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gca.h"
#include "gca/collectives.h"

typedef enum gca__coll_kind {
  GCA__ALL_GATHER = 0,
  GCA__REDUCE_SCATTER = 1,
  GCA__ALL_REDUCE = 2,
} gca__coll_kind_t;

const char *gca__coll_kind_name(gca__coll_kind_t kind);

typedef struct gca__clique gca__clique_t;
typedef struct gca__proc gca__proc_t;

/* One collective as issued by one rank; run by its stream (sim_run.c). A
 * captured one is kept by its communicator for replays. */
typedef struct gca__coll {
  gca_comm_t *comm;
  gca__coll_kind_t kind;
  const void *send;
  void *recv;
  size_t count; /* sendcount, recvcount or count, as the call names it */
  gca_dtype_t dtype;
  gca_reduce_op_t op;
  bool persistent;
  struct gca__coll *next; /* the communicator's persistent ones */
} gca__coll_t;

struct gca_comm {
  uint64_t magic;
  uint64_t serial;       /* never reused in the process (Note [Comm pools]) */
  gca__clique_t *clique; /* sim, ranks as threads */
  gca__proc_t *proc;     /* sim, ranks as processes (Note [Sim ranks as processes]) */
  int rank, nranks, device;
  gca_comm_options_t opts;
  pthread_mutex_t mu; /* inflight, error */
  pthread_cond_t cv;
  uint64_t inflight; /* issued, not yet run */
  gca_status_t error;
  char error_detail[384];
  _Atomic uint64_t issued, bytes, completed, ran;
  gca__coll_t *persistent;
  bool dead;    /* destroyed while captured collectives still name it */
  void *nccl;   /* the NCCL backend's ncclComm_t (else NULL: sim) */
  bool wrapped; /* an ncclComm_t the caller owns: never destroyed here */
  _Atomic uint64_t registrations, registrations_total, deregistrations_total;
};

/* Where the ranks of a sim communicator meet (Note [Sim rendezvous]): in
 * this process's memory for ranks as threads, in memory shared between the
 * processes for ranks as processes (then the mutex and condition variable
 * are process-shared and the mutex robust). */
typedef struct gca__meet {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  int arrived[2];    /* at barrier 0 (posted) and 1 (done reading) */
  int computing;     /* ranks reading the staged inputs with mu let go */
  uint64_t gen[2];
  bool broken;
  char why[384];
} gca__meet_t;

/* What a rank posted at the rendezvous: compared across ranks before any
 * data moves. */
typedef struct gca__coll_desc {
  int32_t kind, dtype, op, posted;
  uint64_t count;
  uint64_t vt; /* the rank's stream clock at the post (Note [Sim virtual time]) */
} gca__coll_desc_t;

/* A group of ranks sharing an id, as threads of this process. */
struct gca__clique {
  unsigned char id[GCA_COMM_ID_BYTES];
  int nranks;
  int refs, joined; /* under m.mu */
  gca__meet_t m;
  gca_comm_t **ranks;
  gca__coll_desc_t *desc; /* the collective under way, per rank */
  void **staged;          /* each rank's copy of its input */
  gca__clique_t *next;
};

/* One rank's view of a clique of processes (sim_proc.c): a mapping of the
 * shared memory holding the meeting place, the descriptors and one staging
 * area of `chunk` bytes per rank. */
struct gca__proc {
  void *map;
  size_t map_bytes;
  gca__meet_t *m;
  gca__coll_desc_t *desc;
  unsigned char *areas;
  size_t chunk;
};

/* sim_run.c: the meeting place's primitives. gca__meet_lock makes a mutex
 * whose owner died consistent again and breaks the meeting, naming that. */
void gca__meet_init(gca__meet_t *m, bool shared);
void gca__meet_destroy(gca__meet_t *m);
void gca__meet_lock(gca__meet_t *m);
void gca__meet_unlock(gca__meet_t *m);
/* With m->mu held: marks the meeting broken with `why` (the first reason
 * sticks) and wakes every rank waiting in it. */
void gca__meet_break(gca__meet_t *m, const char *why);

/* sim_proc.c: joins rank `rank` of `nranks` of the clique of processes named
 * by id; returns once every rank has joined, or fails naming who did not or
 * what failed (a failure of rank 0 once all joined reaches every rank). */
gca_status_t gca__proc_join(const gca_comm_id_t *id, int nranks, int rank,
                            const gca_comm_options_t *o, gca__proc_t **out);
void gca__proc_leave(gca__proc_t *p);

/* sim_run.c: a CLOCK_MONOTONIC deadline s seconds from now (cliques' waits). */
struct timespec;
void gca__deadline_after(double s, struct timespec *ts);
/* sim_run.c: the host function a collective is queued as. */
void gca__sim_run(void *coll);
/* Records a collective's failure on its communicator (the first one sticks). */
void gca__comm_fail(gca_comm_t *comm, gca_status_t st, const char *detail);
/* A run of a collective ended (successfully or not). */
void gca__comm_ran(gca_comm_t *comm, gca__coll_t *coll, bool ok);

/* comm.c: registration for comm pools (comm_pool.c), while the
 * communicator (c, serial) is still live: gca__comm_pool_register fails with
 * GCA_ERR_INVALID_HANDLE when it is not; gca__comm_pool_deregister returns
 * false (and does nothing) when it is not. */
gca_status_t gca__comm_pool_register(gca_comm_t *c, uint64_t serial, void *ptr, size_t bytes,
                                     void **handle);
bool gca__comm_pool_deregister(gca_comm_t *c, uint64_t serial, bool sim, void *handle,
                               gca_status_t *st);

/* nccl.c: the NCCL backend (functions named after the NCCL calls they make) */
gca_status_t gca__nccl_load(void);
gca_status_t gca__nccl_unique_id(gca_comm_id_t *id);
gca_status_t gca__nccl_init_rank(const gca_comm_id_t *id, int nranks, int rank, void **out);
gca_status_t gca__nccl_init_all(int nranks, const int *devices, void **out);
gca_status_t gca__nccl_describe(void *comm, int *rank, int *nranks);
gca_status_t gca__nccl_destroy(void *comm, bool abort);
gca_status_t gca__nccl_async_error(void *comm);
gca_status_t gca__nccl_issue(const char *fn, gca__coll_kind_t kind, const void *send, void *recv,
                             size_t count, gca_dtype_t dtype, gca_reduce_op_t op, void *comm,
                             gca_stream_t stream);
gca_status_t gca__nccl_group(bool start);
gca_status_t gca__nccl_register(void *comm, void *ptr, size_t bytes, void **handle);
gca_status_t gca__nccl_deregister(void *comm, void *handle);

/* reduce.c */
float gca__f16_to_f32(uint16_t h);
uint16_t gca__f32_to_f16(float f);
float gca__bf16_to_f32(uint16_t b);
uint16_t gca__f32_to_bf16(float f);
void gca__reduce(gca_dtype_t dtype, gca_reduce_op_t op, int n, const void *const *in, size_t off,
                 void *out, size_t count);

#endif
