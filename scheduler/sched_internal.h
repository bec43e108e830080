/* SPDX-License-Identifier: Apache-2.0 */
/* sched_internal.h - the scheduler layer's shared representation of a
 * finished op graph: names resolved to indices, storages, producers, and the
 * dependency edges every schedule must respect.
 *
 * Module map: opgraph.c builds and validates graphs (the edges: Note [Op graph
 * rules]); opgraph_json.c loads the gca-opgraph/1 format; estimate.c is the
 * memory estimator and time model; check.c checks an order against the rules
 * without using the edges (an independent reading of the format); schedule.c
 * is the overlap scheduler and its baselines; verify.c the lifecycle
 * verifier; plan.c runs an order on the caller's stream, run after run;
 * execute.c is one measured run of a plan (the executor). */
#ifndef GCA_SCHED_INTERNAL_H
#define GCA_SCHED_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gca/scheduler.h"

#define GCA__NONE ((size_t)-1)

typedef struct gca__sbuf {
  char *name;
  char *alias_of; /* NULL: a storage of its own */
  int64_t bytes;
  gca_buffer_kind_t kind;
  size_t parent;  /* resolved alias_of, or GCA__NONE */
  size_t storage; /* the root buffer's index */
  size_t maker;   /* the op writing it or mutating into it, or GCA__NONE */
  bool version;   /* made by a mutation: a new version of its storage */
} gca__sbuf_t;

typedef struct gca__sop {
  char *name;
  gca_op_kind_t kind;
  double us;
  char *collective, *comm, *waits;
  char **reads_s, **writes_s, **mold_s, **mnew_s; /* names as added */
  size_t nreads, nwrites, nmut;
  size_t *reads, *writes, *mold, *mnew; /* resolved buffer indices */
  size_t comm_idx;                      /* collectives */
  size_t wait;                          /* collectives: their wait op */
  size_t coll;                          /* waits: their collective */
  size_t group;                         /* group index or GCA__NONE */
  size_t *preds;                        /* ops that must come before (Note [Op graph rules]) */
  size_t npreds, cappreds;
} gca__sop_t;

typedef struct gca__names {
  char **keys;
  size_t *vals;
  size_t cap; /* power of two; 0 when empty */
  size_t n;
} gca__names_t;

struct gca_opgraph {
  bool finished;
  gca__sbuf_t *bufs;
  size_t nbufs, capbufs;
  gca__sop_t *ops;
  size_t nops, capops;
  char **comms;
  size_t ncomms, capcomms;
  char ***groups_s; /* groups as added */
  size_t *group_len;
  size_t ngroups, capgroups;
  size_t **groups; /* resolved: op indices in order */
  char **after_later, **after_earlier;
  size_t nafter, capafter;
  size_t *after_l, *after_e; /* resolved */
  gca__names_t buf_names, op_names;
};

gca_status_t gca__names_put(gca__names_t *t, char *key, size_t val, size_t *existing);
size_t gca__names_get(const gca__names_t *t, const char *key);
void gca__names_free(gca__names_t *t);

/* The op that makes buffer b usable (a collective's wait for its outputs), or
 * GCA__NONE for an input's storage that nothing writes. *made: whether
 * anything makes it usable at all. */
size_t gca__opgraph_usable_at(const gca_opgraph_t *g, size_t b, bool *made);
/* The op whose position a use by op i takes: its wait for a collective. */
static inline size_t gca__use_point(const gca_opgraph_t *g, size_t i) {
  return g->ops[i].kind == GCA_OP_COLLECTIVE ? g->ops[i].wait : i;
}
/* estimate.c: figures of an order known to be valid (no check). */
gca_status_t gca__opgraph_estimate_valid(const gca_opgraph_t *g, const size_t *order, size_t n,
                                         gca_schedule_figures_t *f, int64_t *live_after);
/* estimate.c: per storage (root buffer) the step of its allocation and of
 * its free (GCA__NONE: never allocated in the run, or never freed). */
gca_status_t gca__opgraph_lifetimes(const gca_opgraph_t *g, const size_t *order, size_t n,
                                    size_t *alloc_step, size_t *free_step);
/* verify.c: the storage's memory is not the plan's to allocate or free (the
 * caller binds it): its allocation and free are not expected. */
void gca__verifier_ignore(gca_verifier_t *v, size_t storage);
gca_status_t gca__check_graph_arg(const char *fn, const gca_opgraph_t *g, const size_t *order,
                                  size_t n);

#endif
