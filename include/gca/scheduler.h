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

#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gca_opgraph gca_opgraph_t; /* opaque */

typedef enum gca_buffer_kind {
  GCA_BUFFER_TEMP = 0,   /* allocated when written, freed after its last use */
  GCA_BUFFER_INPUT = 1,  /* live from the start, never freed */
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

#ifdef __cplusplus
}
#endif
#endif
