/* SPDX-License-Identifier: Apache-2.0 */
/* train_model.h - the op graph of one FSDP-style training step of a small
 * transformer-shaped model whose compute ops are real kernels, for gca-train
 * and its tests.
 *
 * The model: `layers` residual MLP blocks on a batch of `batch` rows of
 * `hidden` features, x' = x + dropout(relu(x W1)) W2 with W1 hidden x ffn and
 * W2 ffn x hidden, and a squared-error loss against a target. Each layer's
 * parameters are one flat parameter [W1 | W2] sharded evenly over the ranks
 * (rank r holds elements [r S, (r + 1) S)); every rank trains on its own
 * batch, and the update is SGD on the mean of the ranks' gradients.
 *
 * Per layer, forward: a copy-in of the shard grouped with its all-gather,
 * the wait, then fc1 (a matrix product), relu, the dropout's random words
 * (the graph-safe generator), dropout in place, fc2, and the residual add in
 * place; then the loss and its gradient; backward in reverse: the re-gather,
 * the gradients of fc2's input and weight, dropout and relu backward in
 * place, fc1's weight gradient, the input gradient accumulated in place, a
 * reduce-scatter of the flat weight gradient, and the SGD update of the shard
 * in place. Durations come from a cost model (flops and bytes); collectives
 * follow a ring: latency + bytes (ranks - 1) / ranks / bandwidth. */
#ifndef GCA_TOOLS_TRAIN_MODEL_H
#define GCA_TOOLS_TRAIN_MODEL_H

#include <stdint.h>

#include "gca.h"

typedef struct train_shape {
  int layers, ranks;
  uint32_t batch, hidden, ffn;
  float lr;               /* SGD learning rate */
  float dropout;          /* probability of dropping an activation, in [0, 1) */
  double flops_per_us;    /* cost model: compute rate */
  double bytes_per_us;    /* cost model: memory rate of elementwise ops */
  double lat_us;          /* cost model: collective latency */
  double bw_bytes_per_us; /* cost model: collective bandwidth */
} train_shape_t;

/* What a compute op does (an entry per op; collectives and waits: NONE). */
typedef enum train_kind {
  TK_NONE = 0,
  TK_COPY, /* dst = src (bytes) */
  TK_GEMM, /* c = op(a) op(b) (+ c), at offsets into a and b */
  TK_EW,   /* elementwise */
  TK_DOT,  /* loss */
  TK_RNG,  /* random words */
} train_kind_t;

typedef struct train_kernel {
  train_kind_t kind;
  size_t a, b, c;             /* buffer indices (c: the written one) */
  size_t a_off, b_off, c_off; /* element offsets */
  uint32_t m, n, k, flags;    /* gemm */
  gca_ew_op_t ew;
  float s;
  uint32_t u;
  size_t count; /* elements (copy: bytes) */
} train_kernel_t;

typedef struct train_model {
  train_shape_t shape;
  gca_opgraph_t *g;
  train_kernel_t *kernels; /* per op */
  size_t nops;
  size_t shard_elems; /* one layer's shard */
  size_t flat_elems;  /* one layer's flat parameter */
  size_t *shard_buf;  /* per layer: the shard's input buffer */
  size_t x0_buf, target_buf, loss_buf;
  double compute_us; /* sum of the compute ops' durations */
} train_model_t;

/* Validates the shape (a clear message for each bad field) and builds the
 * graph; *m is filled (train_model_free frees it). */
gca_status_t train_model_build(const train_shape_t *s, train_model_t *m);
void train_model_free(train_model_t *m);

/* The compute callback of a plan (gca_execute_options_t.compute): ctx is a
 * train_exec_t. */
typedef struct train_exec {
  const train_model_t *m;
  gca_graph_rng_t *rng;
} train_exec_t;
gca_status_t train_compute(void *ctx, size_t op, void *const *bufs, gca_stream_t stream);

#endif
