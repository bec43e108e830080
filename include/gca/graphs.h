/* SPDX-License-Identifier: Apache-2.0 */
/* gca/graphs.h - graph trees: a function that issues GPU work on a stream is
 * run through a tree of recorded CUDA graphs, as TorchInductor's cudagraph
 * trees do (DESIGN.md "Graph trees").
 *
 * A tree belongs to one device and owns one private pool and one stream. A
 * function is registered with a body callback and a declaration of each input
 * (static, copied or mutated) and of the bytes of each output. Running a
 * function warms it up eagerly inside the pool (warmup_runs times), then
 * records it (captures the body into the pool) and from then on replays the
 * recording while its invariants hold:
 *   - static and mutated inputs are at the addresses they had when recorded;
 *   - inputs that were outputs of an earlier recording on the path are still
 *     at those addresses;
 *   - outputs of earlier recordings that were released when this one was
 *     recorded (so it may reuse their memory) are released now.
 * Copied inputs are copied into the recording's own buffer on each replay.
 * A recording is a child of the recording that ran before it in the same
 * generation (or of the root), keyed by function and shape: A->B and A->B'
 * share A, and the pool layout is checkpointed after each recording and
 * restored before the next, so two branches cost the larger of them, not the
 * sum. A function's shape (the bytes of its inputs and outputs) is the one
 * registered, or one given per run (gca_graph_tree_run_shape): each distinct
 * shape gets recordings of its own, as TorchInductor's cudagraph trees record
 * once per input size. The first run at a new shape of a function already
 * warmed up or recorded at another is recorded at once (no warm-up) and
 * reported as a re-record (GCA_GRAPH_RULE_SHAPE_CHANGED); a shape seen before
 * replays its own recording.
 *
 * When an invariant breaks the tree, in this order, (a) updates the executable
 * graph in place when only input addresses moved (a new capture, exec-update,
 * no instantiation), (b) re-records, (c) runs the function eagerly from then on
 * once it was re-recorded rerecord_limit times. Failed captures, instantiations
 * and launches fall back to an eager run (outside the pool), or, with
 * on_failure GCA_GRAPH_ON_FAILURE_ERROR, fail the run with the error. Each
 * decision other than a plain replay reaches the on_decision callback and the
 * counters.
 *
 * Outputs are owned by the tree: they stay valid until released
 * (gca_graph_tree_release) or until the next generation starts
 * (gca_graph_tree_step), which frees every output of the previous one. A tree
 * is used by one thread at a time; its work runs in order on its stream
 * (gca_graph_tree_stream), which the caller synchronizes with before reading
 * outputs on the host or on other streams.
 */
#ifndef GCA_GRAPHS_H
#define GCA_GRAPHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca/device.h"
#include "gca/pool.h"
#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gca_graph_tree gca_graph_tree_t; /* opaque */
typedef struct gca_graph_fn gca_graph_fn_t;     /* opaque; belongs to one tree */
typedef struct gca_graph_rng gca_graph_rng_t;   /* opaque; belongs to one tree */

typedef enum gca_graph_input_kind {
  GCA_GRAPH_INPUT_STATIC = 0,  /* read in place; its address must not move */
  GCA_GRAPH_INPUT_COPIED = 1,  /* staged into the recording's own buffer each replay */
  GCA_GRAPH_INPUT_MUTATED = 2, /* written in place; its address must not move */
} gca_graph_input_kind_t;

typedef struct gca_graph_input {
  gca_graph_input_kind_t kind;
  size_t bytes; /* bytes the body reads (staged for copied inputs) */
} gca_graph_input_t;

/* Issues the function's work on `stream`: reads inputs[0..ninputs), writes
 * outputs[0..noutputs) (device buffers of the declared sizes, allocated by the
 * tree). Temporaries come from gca_malloc on `stream` and are freed before
 * returning. Work may only go to `stream` (or streams joined to it by events).
 * A failure status is returned by gca_graph_tree_run. */
typedef gca_status_t (*gca_graph_body_t)(gca_stream_t stream, void *const *inputs,
                                         void *const *outputs, void *ctx);

typedef struct gca_graph_fn_desc {
  size_t size;      /* sizeof(gca_graph_fn_desc_t) */
  const char *name; /* for decisions and messages (copied; NULL: "fn") */
  gca_graph_body_t body;
  void *ctx;
  size_t ninputs;
  const gca_graph_input_t *inputs; /* copied at registration */
  size_t noutputs;
  const size_t *output_bytes; /* copied at registration; each > 0 */
} gca_graph_fn_desc_t;

#define GCA_GRAPH_FN_DESC_INIT \
  { sizeof(gca_graph_fn_desc_t), NULL, NULL, NULL, 0, NULL, 0, NULL }

/* What the tree did with one run. */
typedef enum gca_graph_action {
  GCA_GRAPH_WARMUP = 0,   /* eager run inside the pool before recording */
  GCA_GRAPH_RECORD = 1,   /* first recording of a node */
  GCA_GRAPH_REPLAY = 2,   /* (never reported: the hot path) */
  GCA_GRAPH_UPDATE = 3,   /* executable graph updated in place */
  GCA_GRAPH_RERECORD = 4, /* recorded again, new executable graph */
  GCA_GRAPH_EAGER = 5,    /* eager run outside the pool (a fallback) */
} gca_graph_action_t;

/* Why. */
typedef enum gca_graph_rule {
  GCA_GRAPH_RULE_NONE = 0,
  GCA_GRAPH_RULE_STATIC_INPUT_MOVED = 1,    /* static or mutated input not at its address */
  GCA_GRAPH_RULE_ANCESTOR_OUTPUT_MOVED = 2, /* input that was an earlier output moved */
  GCA_GRAPH_RULE_OUTPUT_STILL_LIVE = 3,     /* an output the recording reuses is live */
  GCA_GRAPH_RULE_UPDATE_REJECTED = 4,       /* exec-update refused the new graph */
  GCA_GRAPH_RULE_CAPTURE_FAILED = 5,
  GCA_GRAPH_RULE_INSTANTIATE_FAILED = 6,
  GCA_GRAPH_RULE_LAUNCH_FAILED = 7,
  GCA_GRAPH_RULE_RESTORE_FAILED = 8, /* the pool could not be brought to the parent's layout */
  GCA_GRAPH_RULE_EAGER_FOREVER = 9,  /* the function runs eagerly since it hit the limit */
  GCA_GRAPH_RULE_SHAPE_CHANGED = 10, /* first run at a shape: a recording of its own */
} gca_graph_rule_t;

typedef struct gca_graph_decision {
  const char *function; /* the function's name */
  gca_graph_action_t action;
  gca_graph_rule_t rule;   /* the invariant broken or the failure */
  long arg;                /* input index the rule names, or -1 */
  const void *old_address; /* recorded address of that input (or output), else NULL */
  const void *new_address; /* address now, else NULL */
  bool limit_reached;      /* eager because rerecord_limit re-records were spent */
  gca_status_t status;     /* the failure behind a fallback, else GCA_OK */
  const char *detail;      /* one line for humans; valid during the callback */
} gca_graph_decision_t;

typedef void (*gca_graph_decision_fn_t)(const gca_graph_decision_t *decision, void *ctx);

typedef enum gca_graph_capture_mode {
  GCA_GRAPH_CAPTURE_GLOBAL = 0, /* numerically CUstreamCaptureMode */
  GCA_GRAPH_CAPTURE_THREAD_LOCAL = 1,
  GCA_GRAPH_CAPTURE_RELAXED = 2,
} gca_graph_capture_mode_t;

/* What a run does when capturing, instantiating, restoring the pool for or
 * launching a recording fails. */
typedef enum gca_graph_on_failure {
  /* The function runs eagerly outside the pool (decision GCA_GRAPH_EAGER with
   * the failure's rule and status); the run succeeds if the eager run does. */
  GCA_GRAPH_ON_FAILURE_EAGER = 0,
  /* The run fails with the failure's status and a message naming the
   * function, the step (capture, instantiate, restore, launch) and the
   * operation that failed; no decision is reported, no output is made and the
   * tree stays where it was (a later run tries the same recording again). */
  GCA_GRAPH_ON_FAILURE_ERROR = 1,
} gca_graph_on_failure_t;

typedef struct gca_graph_tree_options {
  size_t size;                           /* sizeof(gca_graph_tree_options_t) */
  unsigned warmup_runs;                  /* eager runs of a node before recording (1) */
  unsigned rerecord_limit;               /* re-records of one function before eager (8);
                                            shape changes do not count */
  gca_graph_capture_mode_t capture_mode; /* (thread-local) */
  /* Debug (sim backend only): stale outputs in the pool are made inaccessible
   * (PROT_NONE) until the tree's next run, so a read of one faults. Outputs
   * are then page-aligned and rounded up to whole pages. */
  bool poison_stale;
  gca_graph_decision_fn_t on_decision; /* may be NULL; must not call into the tree */
  void *decision_ctx;
  /* The pool the tree records into, or NULL: a pool of its own. A pool given
   * here (e.g. a communicator's, gca_comm_pool_create, so that every buffer
   * a recording's collectives use is registered) must be on the tree's
   * device and hold no allocated block; the tree takes a use of it (released
   * at destroy) and owns its layout while it lives: allocate from it only
   * through the tree's runs, or on the tree's stream between them. */
  struct gca_pool *pool;
  gca_graph_on_failure_t on_failure; /* (eager) */
} gca_graph_tree_options_t;

#define GCA_GRAPH_TREE_OPTIONS_INIT                                                            \
  {                                                                                            \
    sizeof(gca_graph_tree_options_t), 1, 8, GCA_GRAPH_CAPTURE_THREAD_LOCAL, false, NULL, NULL, \
        NULL, GCA_GRAPH_ON_FAILURE_EAGER                                                       \
  }

typedef struct gca_graph_stats {
  size_t size;         /* set by the caller: sizeof(gca_graph_stats_t) */
  uint64_t generation; /* current generation, 0 at creation */
  uint64_t warmups;    /* eager runs inside the pool */
  uint64_t records;    /* first recordings */
  uint64_t replays;    /* launches of a recording (first run after a record included) */
  uint64_t updates;    /* in-place exec updates */
  uint64_t rerecords;
  uint64_t eager_fallbacks; /* eager runs outside the pool */
  uint64_t instantiations;  /* executable graphs created */
  uint64_t prologue_writes; /* device writes of RNG offsets before replays */
  uint64_t nodes;           /* recorded nodes in the tree */
  size_t pool_reserved;     /* bytes of the pool's segments */
  size_t pool_allocated;    /* bytes of its allocated blocks */
  uint64_t graph_nodes;     /* operations (kernels, copies, memsets, host functions) in the
                               recordings */
  uint64_t failures;        /* runs failed by a failed recording (on_failure ERROR) */
  uint64_t shapes;          /* distinct (function, shape) pairs warmed up or recorded */
  uint64_t shape_rerecords; /* recordings at a function's new shape (counted in rerecords) */
} gca_graph_stats_t;

/* Creates a tree on `device` with its own pool and stream. opts may be NULL. */
GCA_API gca_status_t gca_graph_tree_create(int device, const gca_graph_tree_options_t *opts,
                                           gca_graph_tree_t **tree);
/* Waits for the tree's work, frees every output, recording and generator, the
 * pool and the stream. The handle is dead afterwards: later calls with it fail
 * with GCA_ERR_INVALID_HANDLE. */
GCA_API gca_status_t gca_graph_tree_destroy(gca_graph_tree_t *tree);
/* The stream the tree's work runs on. */
GCA_API gca_status_t gca_graph_tree_stream(gca_graph_tree_t *tree, gca_stream_t *stream);
/* Waits for the tree's work. */
GCA_API gca_status_t gca_graph_tree_synchronize(gca_graph_tree_t *tree);
/* The tree's private pool (for gca_pool_memory and snapshots; do not route
 * allocations to it). */
GCA_API gca_status_t gca_graph_tree_pool(gca_graph_tree_t *tree, gca_pool_t **pool);

/* Registers a function; it lives as long as the tree. */
GCA_API gca_status_t gca_graph_fn_register(gca_graph_tree_t *tree, const gca_graph_fn_desc_t *desc,
                                           gca_graph_fn_t **fn);

/* Runs fn on inputs[0..ninputs) (device pointers, as many as declared) and
 * stores its outputs' addresses in outputs[0..noutputs). The work is queued
 * on the tree's stream. */
GCA_API gca_status_t gca_graph_tree_run(gca_graph_tree_t *tree, gca_graph_fn_t *fn,
                                        void *const *inputs, size_t ninputs, void **outputs,
                                        size_t noutputs);
/* Runs fn as gca_graph_tree_run does, at a shape of this run's own:
 * input_bytes[0..ninputs) are the bytes the body reads from each input (what a
 * copied input stages), output_bytes[0..noutputs) the bytes of each output
 * the tree allocates (each > 0); the input kinds stay the registered ones.
 * Recordings are keyed by (function, shape) below the node that ran before,
 * so each shape has branches of its own, sharing the pool below their common
 * parent like any sibling branches. The first run at a shape the function was
 * never warmed up or recorded at, once it was at another, records at once and
 * is reported as GCA_GRAPH_RERECORD, rule GCA_GRAPH_RULE_SHAPE_CHANGED, arg
 * the first input whose bytes differ from the shape the function last ran at
 * in the pool (-1 when only output bytes differ), detail naming the old and
 * new bytes. Later runs at a shape replay its recording, or warm up and
 * record below a new parent as usual. A shape change is no invalidation: it
 * does not count toward rerecord_limit (stats: shapes, shape_rerecords); once
 * the function hit the limit it runs eagerly at every shape. The sizes are
 * copied; the registered sizes give exactly gca_graph_tree_run. A body whose
 * work depends on the shape learns it from state its caller sets before the
 * run: the body runs, if at all, during this call.
 * GCA_ERR_INVALID_ARGUMENT, the tree untouched: fn NULL or another tree's,
 * counts other than the registered ones, input_bytes or output_bytes NULL
 * with inputs or outputs to size, an output of 0 bytes, a NULL input of
 * nonzero bytes. */
GCA_API gca_status_t gca_graph_tree_run_shape(gca_graph_tree_t *tree, gca_graph_fn_t *fn,
                                              const size_t *input_bytes, const size_t *output_bytes,
                                              void *const *inputs, size_t ninputs, void **outputs,
                                              size_t noutputs);
/* Gives an output back to the tree: its memory may be reused by later runs.
 * GCA_ERR_INVALID_POINTER for a pointer that is not a live output. */
GCA_API gca_status_t gca_graph_tree_release(gca_graph_tree_t *tree, void *output);
/* Starts a new generation (a new step): every output of the previous one is
 * freed and becomes stale, and the next run starts again from the root. */
GCA_API gca_status_t gca_graph_tree_step(gca_graph_tree_t *tree);
/* *valid: whether ptr is a live output of the current generation (false for a
 * released or stale output and for any other pointer). */
GCA_API gca_status_t gca_graph_tree_output_valid(gca_graph_tree_t *tree, const void *ptr,
                                                 bool *valid);
/* Counters; out->size must be set by the caller. */
GCA_API gca_status_t gca_graph_tree_stats(gca_graph_tree_t *tree, gca_graph_stats_t *out);

/* ---- graph-safe RNG ---- */

/* A Philox4x32-10 generator whose seed and offset live in device memory, so a
 * recording reads them when it is replayed: a replay writes the generator's
 * offset before launch and advances it by the recording's total, and replay k
 * draws exactly what eager step k would. Draws of n numbers advance the offset
 * by n rounded up to a multiple of 4. Lives as long as the tree. */
GCA_API gca_status_t gca_graph_rng_create(gca_graph_tree_t *tree, uint64_t seed,
                                          gca_graph_rng_t **rng);
/* From a body (or eagerly on the tree's stream): dst[0..count) = the next
 * count numbers (uint32) of the generator. dst is a 4-byte aligned device
 * pointer; stream is the body's stream. */
GCA_API gca_status_t gca_graph_rng_uniform_u32(gca_graph_rng_t *rng, void *dst, size_t count,
                                               gca_stream_t stream);
/* The host's view of the generator: its seed and the offset of its next draw. */
GCA_API gca_status_t gca_graph_rng_get_state(gca_graph_rng_t *rng, uint64_t *seed,
                                             uint64_t *offset);
/* Sets seed and offset (offset rounded up to a multiple of 4); the seed's
 * device copy is written on the tree's stream. */
GCA_API gca_status_t gca_graph_rng_set_state(gca_graph_rng_t *rng, uint64_t seed, uint64_t offset);

#ifdef __cplusplus
}
#endif
#endif
