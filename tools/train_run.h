/* SPDX-License-Identifier: Apache-2.0 */
/* train_run.h - gca-train's ranks: each trains the model of train_model.h
 * for a number of steps, through the allocator (expandable segments),
 * collectives, the scheduler's plan, the lifecycle verifier and a graph tree,
 * as threads of this process or as processes, and reports per step and at
 * the end (its loss per step and its parameter shard bit for bit). */
#ifndef GCA_TOOLS_TRAIN_RUN_H
#define GCA_TOOLS_TRAIN_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "train_model.h"

typedef enum train_mode {
  TRAIN_EAGER = 0,     /* program order, run eagerly */
  TRAIN_SCHEDULED = 1, /* the overlap scheduler's order, run eagerly */
  TRAIN_GRAPH = 2,     /* the scheduled order inside a graph tree */
} train_mode_t;

typedef struct train_cfg {
  train_shape_t shape;
  int steps;
  uint64_t seed;
  train_mode_t mode;
  bool processes;      /* ranks as processes (else threads) */
  double time_scale;   /* modelled durations are slept for (0: none) */
  double budget_ratio; /* the scheduler's memory budget over program order's peak */
  int change_step;     /* from this step on the batch is change_batch rows (0: never) */
  uint32_t change_batch;
  const char *fault; /* a sim fault spec armed at fault_step (on rank 0's process) */
  int fault_step;
  bool capture_fallback;     /* a failed recording runs the step eagerly (else it fails) */
  double timeout_s;          /* how long a rank waits for its peers */
  const char *snapshot_path; /* rank 0's allocator snapshot at the end, or NULL */
  bool progress;             /* rank 0 draws a progress bar on stderr */
} train_cfg_t;

/* One step of one rank. */
typedef struct train_step_rec {
  float loss;
  double step_us;                    /* the step's time on its stream (event to event) */
  double exposed_us;                 /* step_us less the modelled compute, at least 0 */
  double host_us;                    /* host time to issue the step */
  uint64_t peak_reserved, peak_live; /* the device's peaks during the step */
  int decision;                      /* gca_graph_action_t, or -1 (no tree) */
  char why[200];                     /* the tree's reason for an eager run, re-record or update */
  size_t mismatches;                 /* the verifier's, this step */
  uint64_t registrations;            /* memory registered with the communicator in the step */
} train_step_rec_t;

/* One rank's result (in memory shared with the ranks' processes). */
typedef struct train_rank_result {
  gca_status_t status;
  char error[768];
  int steps_done;
  int64_t budget_bytes;                      /* the schedule's budget (first batch size) */
  int64_t predicted_peak;                    /* the estimator's peak of the order run */
  double predicted_us, predicted_exposed_us; /* its makespan and exposed communication */
  int64_t bound_bytes;                       /* parameters, batch and loss: outside the plan */
  uint64_t leaked_bytes;                     /* allocated bytes on the device after teardown */
  uint64_t graph_nodes;                      /* recorded nodes in the tree (graph mode) */
  train_step_rec_t *steps;                   /* cfg.steps entries */
  float *params;                             /* layers x shard elements: the shards after the run */
} train_rank_result_t;

typedef struct train_results {
  int ranks, steps;
  size_t shard_elems, layers;
  train_rank_result_t *rank; /* ranks entries */
  void *region;              /* where the records live */
  size_t region_bytes;
} train_results_t;

/* Defaults of every field (4 ranks as threads, eager). */
void train_cfg_default(train_cfg_t *cfg);
/* Runs every rank; GCA_OK when every rank finished every step. On a rank's
 * failure its result names the step, op and cause, the others end at once
 * (their communicator is aborted) and the first failure's text is returned
 * through tool_last_error(). results is filled either way (train_results_free). */
gca_status_t train_run(const train_cfg_t *cfg, train_results_t *results);
void train_results_free(train_results_t *results);
const char *train_decision_name(int decision);

#endif
