/* SPDX-License-Identifier: Apache-2.0 */
/* coll_internal.h - the collectives layer's internals.
 *
 * Module map: comm.c holds communicators (the registry of live handles, ids
 * and cliques of ranks, argument checks) and issues collectives as stream
 * work; sim_run.c runs one collective on a rank when its stream reaches it
 * (the rendezvous of the ranks, the data exchange, the cost model); reduce.c
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
  gca__clique_t *clique;
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

/* A group of ranks sharing an id (sim: threads of this process). */
struct gca__clique {
  unsigned char id[GCA_COMM_ID_BYTES];
  int nranks;
  int refs, joined;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  gca_comm_t **ranks;
  /* the rendezvous of the collective under way (Note [Sim rendezvous]) */
  uint64_t round; /* collectives all ranks completed */
  int arrived[2]; /* at barrier 0 (posted) and 1 (done reading) */
  uint64_t gen[2];
  const gca__coll_t **posted;
  void **staged;
  bool broken;
  char why[384];
  gca__clique_t *next;
};

/* sim_run.c: a CLOCK_MONOTONIC deadline s seconds from now (cliques' waits). */
struct timespec;
void gca__deadline_after(double s, struct timespec *ts);
/* sim_run.c: the host function a collective is queued as. */
void gca__sim_run(void *coll);
/* Marks the clique broken with `why` and wakes every rank waiting in it. */
void gca__clique_break(gca__clique_t *c, const char *why);
/* Records a collective's failure on its communicator (the first one sticks). */
void gca__comm_fail(gca_comm_t *comm, gca_status_t st, const char *detail);
/* A run of a collective ended (successfully or not). */
void gca__comm_ran(gca_comm_t *comm, gca__coll_t *coll, bool ok);

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
