/* SPDX-License-Identifier: Apache-2.0 */
/* gca/scheduler.h - op graphs of a training or inference step (compute ops,
 * collectives, waits; buffers with sizes, views and in-place mutations), the
 * memory estimator and time model every tool reports with, an order checker,
 * and the overlap scheduler (DESIGN.md "Scheduler" and "Op graph").
 *
 * A graph is built through the API (gca_opgraph_create, then buffers, then
 * ops, then gca_opgraph_finish) or loaded from the gca-opgraph/1 JSON format
 * (gca_opgraph_load_json). Ops are added in program order, which is itself a
 * valid schedule. After finish the graph is immutable and may be shared by
 * threads.
 *
 * Semantics (Note [Op graph rules] in scheduler/opgraph.c spells them out):
 *   - dependencies: an op comes after the op that makes each name it reads or
 *     mutates usable (a collective's outputs: its wait); a wait after its
 *     collective; a mutation after every op that reads the old name (a
 *     collective: after its wait); groups contiguous in their given order;
 *     order_after pairs.
 *   - memory: a storage is allocated when the first op writing it is issued
 *     and freed after the last op using it through any name (a collective
 *     uses its inputs and outputs until its wait), unless it is an input
 *     (live from the start) or an output (never freed). Peak = the largest
 *     live total right after an op's allocations.
 *   - time: one compute stream runs compute ops and waits in order; each
 *     communicator has one stream; a collective starts when the compute
 *     stream has finished everything issued before it and its communicator is
 *     free; a wait stalls the compute stream until its collective ends.
 *     Exposed communication is the sum of the stalls.
 */
#ifndef GCA_SCHEDULER_H
#define GCA_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca/device.h"
#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gca_opgraph gca_opgraph_t; /* opaque */

typedef enum gca_buffer_kind {
  GCA_BUFFER_TEMP = 0,   /* allocated when written, freed after its last use */
  GCA_BUFFER_INPUT = 1,  /* live from the start, never freed; written only by mutation */
  GCA_BUFFER_OUTPUT = 2, /* allocated when written, never freed */
} gca_buffer_kind_t;

typedef enum gca_op_kind {
  GCA_OP_COMPUTE = 0,
  GCA_OP_COLLECTIVE = 1,
  GCA_OP_WAIT = 2,
} gca_op_kind_t;

/* An op as added: names are copied; arrays may be NULL when their count is 0.
 * mutates_old[i] is renamed to mutates_new[i] (a buffer declared as a view
 * of the old name's storage). For a collective, `collective` names its kind
 * ("all_gather", "reduce_scatter", "all_reduce", ...) and `comm` its
 * communicator; for a wait, `waits` names the collective. */
typedef struct gca_op_desc {
  size_t size; /* sizeof(gca_op_desc_t) */
  const char *name;
  gca_op_kind_t kind;
  double us; /* duration (compute, collective); 0 for a wait */
  const char *collective;
  const char *comm;
  const char *waits;
  const char *const *reads;
  size_t nreads;
  const char *const *writes;
  size_t nwrites;
  const char *const *mutates_old;
  const char *const *mutates_new;
  size_t nmutates;
} gca_op_desc_t;

#define GCA_OP_DESC_INIT                                                                      \
  {                                                                                           \
    sizeof(gca_op_desc_t), NULL, GCA_OP_COMPUTE, 0, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL, \
        NULL, 0                                                                               \
  }

/* ---- building and loading ---- */

GCA_API gca_status_t gca_opgraph_create(gca_opgraph_t **graph);
GCA_API void gca_opgraph_destroy(gca_opgraph_t *graph);
GCA_API gca_status_t gca_opgraph_add_comm(gca_opgraph_t *graph, const char *comm);
/* A buffer of its own storage (bytes >= 0). */
GCA_API gca_status_t gca_opgraph_add_buffer(gca_opgraph_t *graph, const char *name, int64_t bytes,
                                            gca_buffer_kind_t kind);
/* A view: another name of `alias_of`'s storage (itself possibly a view). */
GCA_API gca_status_t gca_opgraph_add_view(gca_opgraph_t *graph, const char *name,
                                          const char *alias_of);
/* Adds the next op in program order. */
GCA_API gca_status_t gca_opgraph_add_op(gca_opgraph_t *graph, const gca_op_desc_t *op);
/* Ops in `names` must be contiguous, in this order, in every schedule. */
GCA_API gca_status_t gca_opgraph_add_group(gca_opgraph_t *graph, const char *const *names,
                                           size_t n);
/* `later` must come after `earlier` in every schedule. */
GCA_API gca_status_t gca_opgraph_add_order_after(gca_opgraph_t *graph, const char *later,
                                                 const char *earlier);
/* Resolves every name and validates the graph (unknown names, alias cycles,
 * a wait without its collective, a name read before anything makes it, a
 * dependency cycle, a program order that breaks the rules). The error names
 * the op or buffer and what is wrong. */
GCA_API gca_status_t gca_opgraph_finish(gca_opgraph_t *graph);

/* Parses a gca-opgraph/1 document (len bytes, no terminator needed) into a
 * finished graph. Errors: GCA_ERR_PARSE with the byte offset for malformed
 * JSON, GCA_ERR_INVALID_ARGUMENT naming the field, op or buffer otherwise. */
GCA_API gca_status_t gca_opgraph_load_json(const char *text, size_t len, gca_opgraph_t **graph);

/* ---- queries ---- */

GCA_API size_t gca_opgraph_op_count(const gca_opgraph_t *graph);
GCA_API const char *gca_opgraph_op_name(const gca_opgraph_t *graph, size_t op);
GCA_API gca_op_kind_t gca_opgraph_op_kind(const gca_opgraph_t *graph, size_t op);
/* The op's index by name (GCA_ERR_NOT_FOUND when none). */
GCA_API gca_status_t gca_opgraph_op_index(const gca_opgraph_t *graph, const char *name, size_t *op);
/* Buffers (views included) in the order they were added; a buffer's index by
 * name (GCA_ERR_NOT_FOUND when none). */
GCA_API size_t gca_opgraph_buffer_count(const gca_opgraph_t *graph);
GCA_API gca_status_t gca_opgraph_buffer_index(const gca_opgraph_t *graph, const char *name,
                                              size_t *buffer);
/* The program order: 0, 1, ..., n-1 (n = gca_opgraph_op_count). */
GCA_API gca_status_t gca_opgraph_program_order(const gca_opgraph_t *graph, size_t *order);

/* ---- estimates ---- */

typedef struct gca_schedule_figures {
  size_t size;            /* sizeof(gca_schedule_figures_t) */
  int64_t peak_bytes;     /* largest live total right after an op's allocations */
  size_t peak_step;       /* position in the order where the peak is reached */
  double makespan_us;     /* until the compute stream and every communicator are done */
  double compute_us;      /* sum of compute ops' durations */
  double comm_us;         /* sum of collectives' durations */
  double exposed_comm_us; /* sum of the compute stream's stalls at waits */
  size_t collectives_total;
  size_t collectives_hidden; /* whose wait did not stall */
} gca_schedule_figures_t;

/* Checks `order` (a permutation of the ops, n of them) against every rule of
 * the format; the first violation is the status's detail, naming the ops. */
GCA_API gca_status_t gca_opgraph_check_order(const gca_opgraph_t *graph, const size_t *order,
                                             size_t n);
/* Memory and time of a valid order. live_after_alloc, when not NULL, gets n
 * values: the live bytes right after step i's allocations. */
GCA_API gca_status_t gca_opgraph_estimate(const gca_opgraph_t *graph, const size_t *order, size_t n,
                                          gca_schedule_figures_t *figures,
                                          int64_t *live_after_alloc);

/* ---- the overlap scheduler ---- */

typedef enum gca_schedule_policy {
  GCA_SCHEDULE_OVERLAP = 0,       /* hide communication under the memory budget */
  GCA_SCHEDULE_PROGRAM = 1,       /* the program order */
  GCA_SCHEDULE_EARLIEST = 2,      /* every collective as early as its inputs allow, no budget */
  GCA_SCHEDULE_PREFETCH_NEXT = 3, /* each collective issued at its predecessor's wait, no budget */
} gca_schedule_policy_t;

typedef struct gca_schedule_options {
  size_t size; /* sizeof(gca_schedule_options_t) */
  gca_schedule_policy_t policy;
  /* Memory budget: budget_bytes when > 0, else the program order's peak
   * times (1 + budget_ratio). Default ratio 0.03. */
  int64_t budget_bytes;
  double budget_ratio;
  /* Keep each communicator's collectives in program order. */
  bool keep_comm_order;
} gca_schedule_options_t;

#define GCA_SCHEDULE_OPTIONS_INIT \
  { sizeof(gca_schedule_options_t), GCA_SCHEDULE_OVERLAP, 0, 0.03, false }

/* Writes a valid order of the n ops to order[0..n). Deterministic: the same
 * graph and options give the same order. Under GCA_SCHEDULE_OVERLAP the
 * order's peak stays within the budget whenever the program order's does
 * (the program order is returned when nothing better fits). figures may be
 * NULL. */
GCA_API gca_status_t gca_opgraph_schedule(const gca_opgraph_t *graph,
                                          const gca_schedule_options_t *opts, size_t *order,
                                          size_t n, gca_schedule_figures_t *figures);

/* ---- the lifecycle verifier ----
 *
 * Observes the allocations and frees that really happen on a device (through
 * a trace observer) while a plan runs, and after every op compares them with
 * the estimator's plan for that step: the storages first written by the op
 * are allocated (matched by size), the temporaries whose last use it is are
 * freed, and nothing else is allocated or freed. Allocations and frees made
 * outside begin_op/end_op (inputs, outputs freed after the run) are ignored. */

typedef struct gca_verifier gca_verifier_t;

typedef enum gca_verify_mode {
  GCA_VERIFY_LOG = 0,    /* count and log mismatches; the run goes on */
  GCA_VERIFY_ASSERT = 1, /* the first mismatch fails end_op (GCA_ERR_INVALID_STATE) */
} gca_verify_mode_t;

typedef enum gca_mismatch_kind {
  GCA_MISMATCH_MISSING_FREE = 0,     /* the plan frees a storage here; nothing was freed */
  GCA_MISMATCH_UNEXPECTED_FREE = 1,  /* a storage was freed where the plan keeps it */
  GCA_MISMATCH_UNEXPECTED_ALLOC = 2, /* an allocation the plan does not make here */
  GCA_MISMATCH_MISSING_ALLOC = 3,    /* the plan allocates a storage here; nothing was */
} gca_mismatch_kind_t;

typedef struct gca_mismatch {
  gca_mismatch_kind_t kind;
  size_t step;        /* position in the order */
  const char *op;     /* the op at that step (owned by the graph) */
  const char *buffer; /* the storage's name, or NULL for an allocation the plan lacks */
  uint64_t bytes;
} gca_mismatch_t;

/* The verifier of `order` (a valid order of graph's ops) on `device`. */
GCA_API gca_status_t gca_verifier_create(const gca_opgraph_t *graph, const size_t *order, size_t n,
                                         int device, gca_verify_mode_t mode,
                                         gca_verifier_t **verifier);
GCA_API void gca_verifier_destroy(gca_verifier_t *verifier);
/* Brackets the allocations and frees of the op at `step`. */
GCA_API gca_status_t gca_verifier_begin_op(gca_verifier_t *verifier, size_t step);
GCA_API gca_status_t gca_verifier_end_op(gca_verifier_t *verifier, size_t step);
/* Mismatches so far, and the first of them (when any). */
GCA_API gca_status_t gca_verifier_result(const gca_verifier_t *verifier, size_t *mismatches,
                                         gca_mismatch_t *first);
GCA_API const char *gca_mismatch_kind_name(gca_mismatch_kind_t kind);

/* ---- the executor ----
 *
 * Runs an order on gca streams of `device`: a compute stream runs each
 * compute op as a kernel of its duration (times time_scale), each
 * communicator has a stream on which a collective runs for its duration once
 * the compute stream has reached it (an event), and a wait makes the compute
 * stream wait for its collective's end (an event). Storages are allocated
 * through the allocator (gca_malloc) at the step the plan allocates them and
 * freed at the step it frees them, with the streams that used them recorded;
 * inputs are allocated before the first op and, like outputs, freed after the
 * run. Collectives run through the communicators given (else they are
 * modelled by their duration on their communicator's stream, one rank); the
 * lifecycle verifier runs alongside when asked. */

typedef enum gca_execute_fault {
  GCA_EXECUTE_FAULT_NONE = 0,
  GCA_EXECUTE_FAULT_LATE_FREE = 1,   /* the first free at fault_step happens a step later */
  GCA_EXECUTE_FAULT_EARLY_FREE = 2,  /* a storage due to be freed later is freed at fault_step */
  GCA_EXECUTE_FAULT_EXTRA_ALLOC = 3, /* an extra allocation at fault_step (freed after the run) */
  GCA_EXECUTE_FAULT_SKIP_ALLOC = 4,  /* the first allocation at fault_step is not made */
} gca_execute_fault_t;

typedef struct gca_execute_options {
  size_t size; /* sizeof(gca_execute_options_t) */
  int device;
  double time_scale; /* durations are multiplied by it (1.0: microseconds as given) */
  bool verify;
  gca_verify_mode_t verify_mode;
  /* For testing the verifier: a deliberate departure from the plan. */
  gca_execute_fault_t fault;
  size_t fault_step;
  /* This rank's communicator for each of the graph's communicators (in the
   * order they were declared), or NULL: collectives are then modelled by
   * their duration alone. With communicators, all_gather, reduce_scatter and
   * all_reduce move the data through <gca/collectives.h> (every rank runs the
   * same plan, each on its own thread) and then take their duration. */
  struct gca_comm *const *comms;
  /* Real work for compute ops, or NULL: each compute op is then a kernel of
   * its duration. When set, it is called at each compute op's turn with
   * bufs[b] the device address of every buffer b of the graph (a view: its
   * storage's address; NULL when not live) and issues the op's work on
   * `stream` (no allocations: every buffer the op needs is in the graph);
   * a kernel of the op's duration follows when time_scale > 0. */
  gca_status_t (*compute)(void *ctx, size_t op, void *const *bufs, gca_stream_t stream);
  void *compute_ctx;
} gca_execute_options_t;

#define GCA_EXECUTE_OPTIONS_INIT                                                                  \
  {                                                                                               \
    sizeof(gca_execute_options_t), 0, 1.0, true, GCA_VERIFY_LOG, GCA_EXECUTE_FAULT_NONE, 0, NULL, \
        NULL, NULL                                                                                \
  }

typedef struct gca_execute_result {
  size_t size; /* sizeof(gca_execute_result_t) */
  double
      measured_makespan_us; /* from the first op to the last stream's end, divided by time_scale */
  double measured_exposed_comm_us; /* the compute stream's time in the run minus its time
                                      running the same compute kernels alone (measured first) */
  int64_t measured_peak_bytes;     /* the allocator's allocated-bytes peak during the run */
  gca_schedule_figures_t predicted;
  size_t mismatches;
  gca_mismatch_t first_mismatch; /* valid when mismatches > 0 */
} gca_execute_result_t;

GCA_API gca_status_t gca_opgraph_execute(const gca_opgraph_t *graph, const size_t *order, size_t n,
                                         const gca_execute_options_t *opts,
                                         gca_execute_result_t *result);

/* ---- plans: one order run step after step ----
 *
 * What the executor does for one run, kept for many: a plan holds an order's
 * communicator streams and events, and each gca_plan_run issues the whole
 * order on the caller's stream (the compute stream) — allocations through
 * gca_malloc on that stream at the plan's steps, frees at its steps,
 * collectives on the communicators' streams forked from it by events and
 * joined back to it before the run returns — and never synchronizes, so a
 * run can be captured into a graph (a graph tree's body) as well as run
 * eagerly. The options are the executor's (time_scale may be 0: no modelled
 * durations; faults apply to every run). A plan is used by one thread at a
 * time and is destroyed after its last run's work is done (or synchronized). */

typedef struct gca_plan gca_plan_t;

GCA_API gca_status_t gca_plan_create(const gca_opgraph_t *graph, const size_t *order, size_t n,
                                     const gca_execute_options_t *opts, gca_plan_t **plan);
/* One run on `stream`. bind, when not NULL, has gca_opgraph_buffer_count
 * entries: bind[b] != NULL for a storage b (a buffer that is not a view) is
 * the caller's memory for it (at least its bytes; never allocated or freed by
 * the plan, and not expected by the verifier); every other storage the plan
 * allocates: inputs at the start, the rest at their steps, and what is still
 * live (inputs, outputs) is freed at the end, stream-ordered. *mismatches
 * (may be NULL) gets this run's verifier mismatches. On failure the run's
 * memory is given back and the error names the step and op. */
GCA_API gca_status_t gca_plan_run(gca_plan_t *plan, gca_stream_t stream, void *const *bind,
                                  size_t *mismatches);
/* Mismatches over every run so far, and the first of them (when any). */
GCA_API gca_status_t gca_plan_result(const gca_plan_t *plan, size_t *mismatches,
                                     gca_mismatch_t *first);
GCA_API void gca_plan_destroy(gca_plan_t *plan);

#ifdef __cplusplus
}
#endif
#endif
