/* SPDX-License-Identifier: Apache-2.0 */
/* graphs_internal.h - the structures of a graph tree shared by tree.c (the
 * state machine: warm-up, record, replay, update, re-record, eager) and rng.c
 * (graph-safe generators, whose offsets a replay writes before launch).
 *
 * Note [Pool bookkeeping]: replaying a recording writes device memory but does
 * not change the allocator's view of the pool, so that view is only trusted
 * right after it was made to match: before any allocation in the pool (a
 * warm-up or a recording) the tree restores the checkpoint taken after the
 * parent's recording and frees the blocks of the path's outputs that are dead
 * now. Between those points the pool is touched by nothing else: the tree
 * never routes another thread or stream to it, and eager fallbacks allocate
 * outside it.
 */
#ifndef GCA_GRAPHS_INTERNAL_H
#define GCA_GRAPHS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "device.h"
#include "gca/allocator.h"
#include "gca/graphs.h"
#include "gca/pool.h"

/* How a recording receives one input. */
typedef enum in_mode {
  IN_STAGED = 0,   /* copied into staging[i] before each launch */
  IN_FIXED = 1,    /* static or mutated: recorded address */
  IN_ANCESTOR = 2, /* an output of an ancestor recording: recorded address */
} in_mode_t;

typedef struct gca__gnode gca__gnode_t;

/* One shape a function runs at: the bytes of each input and output. Interned
 * per function (gca_graph_fn.shapes, the registered shape first), so a node's
 * key (parent, function, shape) compares shapes by address. A shape is known
 * once the function was warmed up or recorded at it; the first run at an
 * unknown shape of a function with a known one is a shape change
 * (GCA_GRAPH_RULE_SHAPE_CHANGED): recorded at once, no warm-up. */
typedef struct gca__shape {
  size_t *in;  /* [ninputs] bytes of each input */
  size_t *out; /* [noutputs] bytes of each output, each > 0 */
  bool known;
  struct gca__shape *next;
} gca__shape_t;

/* One output of one node, named across the tree. */
typedef struct gca__out_ref {
  gca__gnode_t *node;
  size_t index;
} gca__out_ref_t;

/* A generator used by a recording, and the offset units its draws take. */
typedef struct gca__rng_use {
  gca_graph_rng_t *rng;
  uint64_t total;
} gca__rng_use_t;

/* A recording: a child of `parent` (NULL: the root) for `fn` at `shape`.
 * Invariants: recorded == (exec != NULL) == (ckpt != NULL); out_live[i] is
 * meaningful only while out_gen == tree->gen; every dead[] and live_at_ckpt[]
 * reference names an ancestor (or, in live_at_ckpt, the node itself). */
struct gca__gnode {
  gca__gnode_t *parent, *children, *next;
  gca_graph_fn_t *fn;
  gca__shape_t *shape; /* one of fn->shapes */
  unsigned warmups;
  bool recorded;
  gca_graph_exec_t exec;
  size_t graph_nodes;     /* operations in the recording (graph_node_count) */
  gca_pool_state_t *ckpt; /* the pool after this recording */
  in_mode_t *in_mode;     /* [ninputs] */
  void **in_addr;         /* [ninputs] recorded address (FIXED, ANCESTOR) */
  void **staging;         /* [ninputs] staging buffer (STAGED) */
  void **out_ptr;         /* [noutputs] addresses handed out */
  void **out_block;       /* [noutputs] allocator blocks behind them */
  bool *out_live;         /* [noutputs] */
  uint64_t out_gen;
  gca__out_ref_t *dead; /* ancestor outputs released when recorded */
  size_t ndead;
  gca__out_ref_t *live_at_ckpt; /* path outputs live in ckpt (own included) */
  size_t nlive;
  gca__rng_use_t *rng;
  size_t nrng;
};

struct gca_graph_fn {
  gca_graph_tree_t *tree;
  char *name;
  gca_graph_body_t body;
  void *ctx;
  size_t ninputs, noutputs;
  gca_graph_input_t *inputs; /* kinds (bytes: the registered shape's) */
  gca__shape_t *shapes;      /* interned; the registered shape first */
  gca__shape_t *last;        /* the shape of its last run in the pool, NULL before one */
  unsigned rerecords;        /* re-records for broken invariants (shape changes not counted) */
  bool eager_forever;
  gca_graph_fn_t *next;
};

struct gca_graph_rng {
  gca_graph_tree_t *tree;
  uint64_t seed, offset; /* host view */
  gca_devptr_t dev;      /* 3 x u64: seed, replay offset, zero (eager draws add to it) */
  gca_graph_rng_t *next;
};

/* Where an output handed out in this generation lives. */
typedef enum out_kind {
  OUT_RECORDED = 0,   /* a recording's output (node, index) */
  OUT_POOL_EAGER = 1, /* a warm-up's output, allocated in the pool */
  OUT_EAGER = 2,      /* an eager fallback's output, outside the pool */
} out_kind_t;

typedef struct gca__live_out {
  void *ptr, *block;
  size_t bytes; /* bytes of the page-aligned region with poison_stale, else requested */
  out_kind_t kind;
  gca__out_ref_t ref; /* OUT_RECORDED */
  bool released;
} gca__live_out_t;

typedef enum tree_mode {
  MODE_TREE = 0,      /* runs replay or record below `pos` */
  MODE_EAGER_POOL = 1 /* a warm-up ran this generation: eager in the pool until the step */
} tree_mode_t;

struct gca_graph_tree {
  int device;
  gca_graph_tree_options_t opts;
  const gca_device_ops_t *ops;
  gca_stream_t stream;
  gca_pool_t *pool;
  gca_pool_state_t *root_ckpt; /* the empty pool */
  gca__gnode_t root;           /* children of the root; never recorded */
  gca__gnode_t *pos;           /* the node that ran last in this generation (&root at start) */
  tree_mode_t mode;
  uint64_t gen;
  gca_graph_fn_t *fns;
  gca_graph_rng_t *rngs;
  gca__live_out_t *outs; /* handed out in this generation */
  size_t nouts, capouts;
  struct {
    void *ptr;
    size_t bytes;
  } * poisoned; /* regions made inaccessible */
  size_t npoisoned, cappoisoned;
  /* During a capture: the node being recorded and the generators it draws from. */
  bool capturing;
  gca__rng_use_t *cap_rng;
  size_t ncap_rng, capcap_rng;
  gca_graph_stats_t stats;
  gca_graph_tree_t *next_live;
};

/* ---- tree.c ---- */

/* GCA_OK when tree is a live tree; else GCA_ERR_INVALID_HANDLE naming `op`. */
gca_status_t gca__graph_tree_check(const char *op, const gca_graph_tree_t *tree);

/* ---- rng.c ---- */

/* Writes the offsets of a recording's generators on the tree's stream and
 * advances their host offsets by the recording's totals. */
gca_status_t gca__graph_rng_prologue(gca_graph_tree_t *tree, const gca__gnode_t *node);
/* Undoes the host advance of a prologue whose launch failed. */
void gca__graph_rng_unadvance(const gca__gnode_t *node);
/* Frees the tree's generators (the stream is idle). */
void gca__graph_rng_free_all(gca_graph_tree_t *tree);

#endif
