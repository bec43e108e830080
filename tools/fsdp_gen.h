/* SPDX-License-Identifier: Apache-2.0 */
/* fsdp_gen.h - op graphs of an FSDP training step of a transformer-shaped
 * model, built through <gca/scheduler.h>, for gca-bench-sched and the
 * scheduler's tests.
 *
 * Per layer, forward: a copy-in of the layer's parameter shard grouped with
 * its all-gather, the wait, then three compute ops reading the gathered
 * parameters through a view (the first saving an activation for backward);
 * backward in reverse: the re-gather (grouped copy-in), two gradient ops (the
 * second writes the input gradient and the full weight gradient: a
 * multi-output op), and a reduce-scatter of the weight gradient into the
 * sharded gradient (an output). Collective times follow a ring:
 * latency + bytes * (ranks - 1) / ranks / bandwidth. */
#ifndef GCA_TOOLS_FSDP_GEN_H
#define GCA_TOOLS_FSDP_GEN_H

#include <stdint.h>

#include "gca.h"

typedef struct fsdp_shape {
  int layers;
  int ranks;
  int64_t param_bytes;     /* one layer's gathered parameters */
  int64_t x_bytes;         /* the hidden state between layers */
  int64_t act_saved_bytes; /* activations a layer saves for backward */
  int64_t act_temp_bytes;  /* its largest temporary */
  double fwd_us;           /* one layer's forward compute (backward: twice) */
  double bw_bytes_per_us;  /* collective bandwidth */
  double lat_us;           /* collective latency */
} fsdp_shape_t;

/* Builds and finishes the graph (ops: 15 per layer + 1). */
gca_status_t fsdp_graph(const fsdp_shape_t *s, gca_opgraph_t **out);

#endif
