/* SPDX-License-Identifier: Apache-2.0 */
/* train_run.c - gca-train's ranks (train_run.h).
 *
 * The one idea: every rank does the same thing with its own data — builds a
 * plan of the step's order (program order or the overlap scheduler's under a
 * memory budget), keeps its parameter shard and its batch in memory of its
 * own (the plan's bound buffers), and issues each step either straight on
 * its graph tree's stream or through the tree (one step function whose body
 * is the plan's run: warm-up, record, then replays; a batch size is a shape of
 * it, recorded once as a re-record of its own branch) — so the three
 * ways of running differ only in who issues the same kernels in the same
 * order on the same data, and their losses and parameters can be compared
 * bit for bit (Note [Bit-equal steps]). */
#include "train_run.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

#define MAX_SHAPES 2

/* Note [Bit-equal steps]: the kernels sum in a fixed order, the collectives
 * reduce in rank order on threads and processes alike, and the dropout's
 * words come from the tree's graph-safe generator, whose replay k draws what
 * eager step k draws; the batches and the initial parameters are a function
 * of (seed, rank, step). So eager, scheduled and replayed steps differ only
 * in when the same work runs, never in what it computes. */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A uniform float in [-1, 1) from a key. */
static float unit(uint64_t key) {
  return (float)((double)(mix(key) >> 40) / (double)(1ull << 23) - 1.0);
}

const char *train_decision_name(int d) {
  static const char *const names[] = {"warm-up", "record",    "replay",
                                      "update",  "re-record", "eager"};
  if (d < 0)
    return "eager";
  return (size_t)d < sizeof(names) / sizeof(names[0]) ? names[d] : "?";
}

void train_cfg_default(train_cfg_t *c) {
  memset(c, 0, sizeof(*c));
  c->shape = (train_shape_t){.layers = 4,
                             .ranks = 4,
                             .batch = 32,
                             .hidden = 128,
                             .ffn = 256,
                             .lr = 0.05f,
                             .dropout = 0.1f,
                             .flops_per_us = 5e5,
                             .bytes_per_us = 1e6,
                             .lat_us = 5,
                             .bw_bytes_per_us = 2.5e4};
  c->steps = 8;
  c->seed = 1;
  c->mode = TRAIN_GRAPH;
  c->time_scale = 1.0;
  c->budget_ratio = 0.03;
  c->timeout_s = 30;
}

/* ---- one rank ---- */

/* Where thread ranks meet before a fault is armed, so that it fires in the
 * step it was meant for on whichever rank comes first (the sim's faults are
 * the process's); a rank that fails breaks it and nobody waits any more. */
typedef struct meet {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, arrived;
  unsigned gen;
  bool broken;
} meet_t;

static bool meet_wait(meet_t *m) {
  pthread_mutex_lock(&m->mu);
  bool ok = !m->broken;
  if (ok && ++m->arrived == m->n) {
    m->arrived = 0;
    m->gen++;
    pthread_cond_broadcast(&m->cv);
  } else if (ok) {
    unsigned gen = m->gen;
    while (m->gen == gen && !m->broken)
      pthread_cond_wait(&m->cv, &m->mu);
    ok = m->gen != gen; /* everyone arrived, whatever happened since */
  }
  pthread_mutex_unlock(&m->mu);
  return ok;
}

static void meet_break(meet_t *m) {
  pthread_mutex_lock(&m->mu);
  m->broken = true;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* What one batch size needs: its model, order and plan, and its batch's
 * buffers. In graph mode it is a shape of the rank's one step function. */
typedef struct shape_run {
  train_model_t model;
  size_t *order;
  gca_plan_t *plan;
  void *x0, *target; /* the batch's device buffers */
  void **bind;       /* per buffer */
} shape_run_t;

typedef struct rank {
  const train_cfg_t *cfg;
  const train_model_t *models; /* MAX_SHAPES (the second unused without a change) */
  int nshapes;
  int rank, device;
  meet_t *meet; /* thread ranks */
  char *why;    /* the current step's record's reason, while it runs */
  gca_comm_t *comm;
  train_rank_result_t *res;
  gca_pool_t *pool; /* the step's memory: a comm pool, the tree's pool too */
  gca_graph_tree_t *tree;
  gca_stream_t stream;
  gca_graph_rng_t *rng;
  train_exec_t exec;
  shape_run_t sh[MAX_SHAPES];
  int cur;            /* the shape of the step running: the body's plan */
  gca_graph_fn_t *fn; /* the step, at every shape (graph mode) */
  void **shards;      /* per layer */
  void *dloss;        /* the loss when no tree owns it */
  float *host;        /* pinned staging: a batch's x0 and target, then the loss */
  size_t host_bytes;
  gca_event_t t0, t1;
  size_t step_mismatches;
  int decision;
} rank_t;

static void on_decision(const gca_graph_decision_t *d, void *ctx) {
  rank_t *rk = ctx;
  rk->decision = (int)d->action;
  if ((d->action == GCA_GRAPH_EAGER || d->action == GCA_GRAPH_RERECORD ||
       d->action == GCA_GRAPH_UPDATE) &&
      rk->why)
    snprintf(rk->why, sizeof(((train_step_rec_t *)0)->why), "%s", d->detail ? d->detail : "");
}

/* The step function's body: the plan of the current batch size (rk->cur, set
 * before the run; the tree calls the body only during it). */
static gca_status_t body(gca_stream_t stream, void *const *in, void *const *out, void *ctx) {
  rank_t *rk = ctx;
  shape_run_t *s = &rk->sh[rk->cur];
  const train_model_t *m = &s->model;
  s->bind[m->x0_buf] = in[0];
  s->bind[m->target_buf] = in[1];
  for (int l = 0; l < m->shape.layers; l++)
    s->bind[m->shard_buf[l]] = in[2 + l];
  s->bind[m->loss_buf] = out[0];
  size_t mm = 0;
  gca_status_t st = gca_plan_run(s->plan, stream, s->bind, &mm);
  rk->step_mismatches += mm;
  return st;
}

/* The sizes of the step function's inputs (x0, target, the shards) and of
 * its output (the loss) at shape s: the tree's key for s's recordings. */
static void step_shape(const shape_run_t *s, size_t *in_bytes, size_t *out_bytes) {
  const train_model_t *m = &s->model;
  size_t bh = (size_t)m->shape.batch * m->shape.hidden * 4;
  in_bytes[0] = in_bytes[1] = bh;
  for (int l = 0; l < m->shape.layers; l++)
    in_bytes[2 + l] = m->shard_elems * 4;
  out_bytes[0] = 4;
}

/* The order, plan and batch buffers of one batch size; with the first, the
 * step function (graph mode), registered at that size. */
static gca_status_t shape_setup(rank_t *rk, int i) {
  const train_cfg_t *c = rk->cfg;
  shape_run_t *s = &rk->sh[i];
  s->model = rk->models[i]; /* shared, read-only: the graph is finished */
  const train_model_t *m = &s->model;
  size_t n = gca_opgraph_op_count(m->g), nb = gca_opgraph_buffer_count(m->g);
  s->order = malloc(n * sizeof(size_t));
  s->bind = calloc(nb, sizeof(void *));
  if (!s->order || !s->bind)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "no host memory");
  gca_schedule_figures_t prog = {.size = sizeof(prog)}, f = {.size = sizeof(f)};
  TOOL_CHECK_GCA(gca_opgraph_program_order(m->g, s->order));
  TOOL_CHECK_GCA(gca_opgraph_estimate(m->g, s->order, n, &prog, NULL));
  if (c->mode != TRAIN_EAGER) {
    gca_schedule_options_t so = GCA_SCHEDULE_OPTIONS_INIT;
    so.budget_ratio = c->budget_ratio;
    TOOL_CHECK_GCA(gca_opgraph_schedule(m->g, &so, s->order, n, &f));
  } else {
    f = prog;
  }
  if (i == 0) {
    rk->res->budget_bytes = c->mode == TRAIN_EAGER
                                ? prog.peak_bytes
                                : (int64_t)((double)prog.peak_bytes * (1.0 + c->budget_ratio));
    rk->res->predicted_peak = f.peak_bytes;
    rk->res->predicted_us = f.makespan_us;
    rk->res->predicted_exposed_us = f.exposed_comm_us;
  }
  gca_execute_options_t eo = GCA_EXECUTE_OPTIONS_INIT;
  eo.device = rk->device;
  eo.time_scale = c->time_scale;
  eo.verify = true;
  eo.comms = &rk->comm;
  eo.compute = train_compute;
  eo.compute_ctx = &rk->exec;
  TOOL_CHECK_GCA(gca_plan_create(m->g, s->order, n, &eo, &s->plan));
  size_t bh = (size_t)m->shape.batch * m->shape.hidden * 4;
  TOOL_CHECK_GCA(gca_malloc(&s->x0, bh, rk->stream));
  TOOL_CHECK_GCA(gca_malloc(&s->target, bh, rk->stream));
  if (c->mode == TRAIN_GRAPH && i == 0) {
    int L = m->shape.layers;
    gca_graph_input_t in[2 + 64];
    size_t in_bytes[2 + 64], out_bytes;
    step_shape(s, in_bytes, &out_bytes);
    in[0] = (gca_graph_input_t){GCA_GRAPH_INPUT_STATIC, in_bytes[0]};
    in[1] = (gca_graph_input_t){GCA_GRAPH_INPUT_STATIC, in_bytes[1]};
    for (int l = 0; l < L; l++)
      in[2 + l] = (gca_graph_input_t){GCA_GRAPH_INPUT_MUTATED, in_bytes[2 + l]};
    gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
    d.name = "step";
    d.body = body;
    d.ctx = rk;
    d.ninputs = (size_t)(2 + L);
    d.inputs = in;
    d.noutputs = 1;
    d.output_bytes = &out_bytes;
    TOOL_CHECK_GCA(gca_graph_fn_register(rk->tree, &d, &rk->fn));
  }
  return GCA_OK;
}

/* The initial parameters: the whole flat parameter of a layer is a function
 * of (seed, layer, index); each rank copies in its slice. */
static gca_status_t params_setup(rank_t *rk) {
  const train_model_t *m = &rk->models[0];
  const train_shape_t *s = &m->shape;
  size_t S = m->shard_elems, hf = (size_t)s->hidden * s->ffn;
  rk->shards = calloc((size_t)s->layers, sizeof(void *));
  float *h = malloc(S * sizeof(float));
  if (!rk->shards || !h) {
    free(h);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "no host memory");
  }
  gca_status_t st = GCA_OK;
  for (int l = 0; l < s->layers && st == GCA_OK; l++) {
    for (size_t i = 0; i < S; i++) {
      size_t e = (size_t)rk->rank * S + i;
      float scale = 1.0f / sqrtf((float)(e < hf ? s->hidden : s->ffn));
      h[i] = scale * unit(rk->cfg->seed * 0x100000001b3ull ^ ((uint64_t)l << 40) ^ e);
    }
    if ((st = gca_malloc(&rk->shards[l], S * 4, rk->stream)) != GCA_OK ||
        (st = gca_memcpy_async(rk->shards[l], h, S * 4, rk->stream)) != GCA_OK ||
        (st = gca_stream_synchronize(rk->stream)) != GCA_OK)
      tool_error_gca(st, "parameters of layer %d", l);
  }
  free(h);
  return st;
}

/* Writes step k's batch (rows x hidden of x0 and of the target) into s's
 * buffers, through the pinned staging buffer. */
static gca_status_t batch(rank_t *rk, shape_run_t *s, int k) {
  const train_shape_t *sh = &s->model.shape;
  size_t n = (size_t)sh->batch * sh->hidden;
  uint64_t key = mix(rk->cfg->seed ^ ((uint64_t)rk->rank << 48) ^ ((uint64_t)k << 24));
  for (size_t i = 0; i < n; i++) {
    rk->host[i] = unit(key ^ (i << 1));
    rk->host[n + i] = 0.5f * unit(key ^ (i << 1) ^ 1);
  }
  TOOL_CHECK_GCA(gca_memcpy_async(s->x0, rk->host, n * 4, rk->stream));
  TOOL_CHECK_GCA(gca_memcpy_async(s->target, rk->host + n, n * 4, rk->stream));
  return GCA_OK;
}

static gca_status_t one_step(rank_t *rk, int k) {
  const train_cfg_t *c = rk->cfg;
  int si = rk->nshapes > 1 && k >= c->change_step ? 1 : 0;
  shape_run_t *s = &rk->sh[si];
  const train_model_t *m = &s->model;
  train_step_rec_t *rec = &rk->res->steps[k];
  if (c->fault && k == c->fault_step) {
    if (rk->meet && !meet_wait(rk->meet))
      return tool_error(GCA_ERR_INVALID_STATE, "a peer failed before step %d", k);
    if (rk->rank == 0)
      TOOL_CHECK_GCA(gca_sim_fault_set(c->fault));
    if (rk->meet && !meet_wait(rk->meet))
      return tool_error(GCA_ERR_INVALID_STATE, "a peer failed before step %d", k);
  }
  TOOL_CHECK(batch(rk, s, k));
  TOOL_CHECK_GCA(gca_stream_synchronize(rk->stream));
  TOOL_CHECK_GCA(gca_reset_peak_stats(rk->device));
  rk->step_mismatches = 0;
  gca_comm_stats_t cs0 = {.size = sizeof(cs0)}, cs1 = {.size = sizeof(cs1)};
  TOOL_CHECK_GCA(gca_comm_stats(rk->comm, &cs0));
  rk->decision = c->mode == TRAIN_GRAPH ? GCA_GRAPH_REPLAY : -1;
  rec->why[0] = 0;
  rk->why = rec->why;
  uint64_t h0 = tool_now_ns();
  TOOL_CHECK_GCA(gca_event_record(rk->t0, rk->stream));
  void *loss = NULL;
  if (c->mode == TRAIN_GRAPH) {
    void *in[2 + 64];
    size_t in_bytes[2 + 64], out_bytes;
    in[0] = s->x0;
    in[1] = s->target;
    for (int l = 0; l < m->shape.layers; l++)
      in[2 + l] = rk->shards[l];
    step_shape(s, in_bytes, &out_bytes);
    rk->cur = si;
    TOOL_CHECK_GCA(gca_graph_tree_step(rk->tree));
    gca_status_t st = gca_graph_tree_run_shape(rk->tree, rk->fn, in_bytes, &out_bytes, in,
                                               (size_t)(2 + m->shape.layers), &loss, 1);
    if (st != GCA_OK)
      return tool_error_gca(st, "graphs");
  } else {
    for (size_t b = 0; b < gca_opgraph_buffer_count(m->g); b++)
      s->bind[b] = NULL;
    s->bind[m->x0_buf] = s->x0;
    s->bind[m->target_buf] = s->target;
    for (int l = 0; l < m->shape.layers; l++)
      s->bind[m->shard_buf[l]] = rk->shards[l];
    s->bind[m->loss_buf] = rk->dloss;
    size_t mm = 0;
    TOOL_CHECK_GCA(gca_pool_use_begin(rk->pool));
    gca_status_t st = gca_plan_run(s->plan, rk->stream, s->bind, &mm);
    gca_status_t est = gca_pool_use_end(rk->pool);
    rk->step_mismatches += mm;
    if (st != GCA_OK)
      return tool_error_gca(st, "gca_plan_run");
    if (est != GCA_OK)
      return tool_error_gca(est, "gca_pool_use_end");
    loss = rk->dloss;
  }
  uint64_t h1 = tool_now_ns();
  TOOL_CHECK_GCA(gca_event_record(rk->t1, rk->stream));
  float *hl = rk->host;
  TOOL_CHECK_GCA(gca_memcpy_async(hl, loss, 4, rk->stream));
  TOOL_CHECK_GCA(gca_stream_synchronize(rk->stream));
  TOOL_CHECK_GCA(gca_comm_async_error(rk->comm));
  float ms = 0;
  TOOL_CHECK_GCA(gca_event_elapsed_time(&ms, rk->t0, rk->t1));
  gca_stats_t st_ = {0};
  TOOL_CHECK_GCA(gca_get_stats(rk->device, &st_));
  rec->loss = hl[0];
  rec->step_us = (double)ms * 1000.0;
  rec->exposed_us = rec->step_us - m->compute_us * c->time_scale;
  if (rec->exposed_us < 0)
    rec->exposed_us = 0;
  rec->host_us = (double)(h1 - h0) / 1000.0;
  rec->peak_reserved = st_.reserved_bytes[GCA_STAT_ALL].peak;
  rec->peak_live = st_.allocated_bytes[GCA_STAT_ALL].peak;
  rec->decision = rk->decision;
  rec->mismatches = rk->step_mismatches;
  TOOL_CHECK_GCA(gca_comm_stats(rk->comm, &cs1));
  rec->registrations = cs1.registrations_total - cs0.registrations_total;
  rk->res->steps_done = k + 1;
  if (c->progress && rk->rank == 0) {
    int w = 30, f = (k + 1) * w / c->steps;
    fprintf(stderr, "\r  [%.*s%.*s] step %d/%d %s%s", f, "##############################", w - f,
            "..............................", k + 1, c->steps, train_decision_name(rec->decision),
            k + 1 == c->steps ? "\r\033[K" : "    ");
  }
  return GCA_OK;
}

static gca_status_t write_snapshot(const char *path) {
  char *json = NULL;
  size_t len = 0;
  TOOL_CHECK_GCA(gca_snapshot_json(&json, &len));
  FILE *f = fopen(path, "w");
  bool ok = f && fwrite(json, 1, len, f) == len;
  if (f && fclose(f) != 0)
    ok = false;
  free(json);
  if (!ok)
    return tool_error(GCA_ERR_IO, "cannot write the snapshot to '%s'", path);
  return GCA_OK;
}

/* Gives back everything the rank made; the parameters go to its result first. */
static void rank_teardown(rank_t *rk, bool keep_params) {
  const train_model_t *m = &rk->models[0];
  size_t S = m->shard_elems;
  if (rk->stream)
    (void)gca_stream_synchronize(rk->stream);
  for (int l = 0; rk->shards && l < m->shape.layers; l++) {
    if (!rk->shards[l])
      continue;
    if (keep_params && gca_memcpy_async(rk->res->params + (size_t)l * S, rk->shards[l], S * 4,
                                        rk->stream) == GCA_OK)
      (void)gca_stream_synchronize(rk->stream);
    (void)gca_free(rk->shards[l]);
  }
  for (int i = 0; i < rk->nshapes; i++) {
    shape_run_t *s = &rk->sh[i];
    if (s->x0)
      (void)gca_free(s->x0);
    if (s->target)
      (void)gca_free(s->target);
    gca_plan_destroy(s->plan);
    free(s->order);
    free(s->bind);
  }
  if (rk->host)
    (void)gca_host_free(rk->host);
  if (rk->dloss)
    (void)gca_free(rk->dloss);
  if (rk->t0)
    (void)gca_event_destroy(rk->t0);
  if (rk->t1)
    (void)gca_event_destroy(rk->t1);
  if (rk->tree) {
    gca_graph_stats_t gs = {.size = sizeof(gs)};
    if (gca_graph_tree_stats(rk->tree, &gs) == GCA_OK)
      rk->res->graph_nodes = gs.graph_nodes;
    (void)gca_graph_tree_destroy(rk->tree);
  }
  if (rk->pool)
    (void)gca_pool_release(rk->pool);
  free(rk->shards);
  /* the cache goes back too, so that a later run on this device starts from
   * nothing and its peaks are its own */
  (void)gca_empty_cache();
  gca_stats_t st = {0};
  if (gca_get_stats(rk->device, &st) == GCA_OK)
    rk->res->leaked_bytes = (uint64_t)st.allocated_bytes[GCA_STAT_ALL].current;
}

static void rank_main(rank_t *rk) {
  const train_cfg_t *c = rk->cfg;
  train_rank_result_t *res = rk->res;
  res->error[0] = 0;
  gca_status_t st = gca_set_device(rk->device);
  if (st != GCA_OK)
    tool_error_gca(st, "gca_set_device(%d)", rk->device);
  /* every buffer of the step — the collectives' included — comes from a
   * pool registered with the communicator; the tree records into it too */
  if (st == GCA_OK && (st = gca_comm_pool_create(rk->comm, NULL, &rk->pool)) != GCA_OK)
    tool_error_gca(st, "gca_comm_pool_create");
  gca_graph_tree_options_t to = GCA_GRAPH_TREE_OPTIONS_INIT;
  to.on_decision = on_decision;
  to.decision_ctx = rk;
  to.pool = rk->pool;
  to.on_failure = c->capture_fallback ? GCA_GRAPH_ON_FAILURE_EAGER : GCA_GRAPH_ON_FAILURE_ERROR;
  if (st == GCA_OK && (st = gca_graph_tree_create(rk->device, &to, &rk->tree)) != GCA_OK)
    tool_error_gca(st, "gca_graph_tree_create");
  if (st == GCA_OK && (st = gca_graph_tree_stream(rk->tree, &rk->stream)) != GCA_OK)
    tool_error_gca(st, "gca_graph_tree_stream");
  if (st == GCA_OK &&
      (st = gca_graph_rng_create(rk->tree, mix(c->seed) ^ (uint64_t)rk->rank, &rk->rng)) != GCA_OK)
    tool_error_gca(st, "gca_graph_rng_create");
  rk->exec.rng = rk->rng;
  if (st == GCA_OK && ((st = gca_event_create(&rk->t0, GCA_EVENT_DEFAULT)) != GCA_OK ||
                       (st = gca_event_create(&rk->t1, GCA_EVENT_DEFAULT)) != GCA_OK))
    tool_error_gca(st, "gca_event_create");
  size_t rows = c->shape.batch > c->change_batch ? c->shape.batch : c->change_batch;
  rk->host_bytes = (2 * (size_t)rows * c->shape.hidden + 1) * 4;
  if (st == GCA_OK && (st = gca_host_alloc((void **)&rk->host, rk->host_bytes)) != GCA_OK)
    tool_error_gca(st, "gca_host_alloc");
  if (st == GCA_OK && (st = gca_malloc(&rk->dloss, 4, rk->stream)) != GCA_OK)
    tool_error_gca(st, "gca_malloc");
  if (st == GCA_OK)
    st = params_setup(rk);
  for (int i = 0; i < rk->nshapes && st == GCA_OK; i++)
    st = shape_setup(rk, i);
  if (st == GCA_OK) {
    const train_model_t *m = &rk->models[0];
    res->bound_bytes = (int64_t)(m->shard_elems * 4 * (size_t)m->shape.layers +
                                 2 * (size_t)m->shape.batch * m->shape.hidden * 4 + 4);
  }
  for (int k = 0; k < c->steps && st == GCA_OK; k++) {
    rk->exec.m = &rk->sh[rk->nshapes > 1 && k >= c->change_step ? 1 : 0].model;
    st = one_step(rk, k);
    if (st != GCA_OK)
      snprintf(res->error, sizeof(res->error), "rank %d: step %d: %s", rk->rank, k,
               tool_last_error());
  }
  if (st != GCA_OK && !res->error[0])
    snprintf(res->error, sizeof(res->error), "rank %d: setup: %s", rk->rank, tool_last_error());
  if (st != GCA_OK) {
    if (rk->meet)
      meet_break(rk->meet);
    (void)gca_comm_abort(rk->comm); /* the peers end at once */
    rk->comm = NULL;
  } else {
    size_t total = 0;
    gca_mismatch_t first;
    for (int i = 0; i < rk->nshapes; i++)
      if (rk->sh[i].plan && gca_plan_result(rk->sh[i].plan, &total, &first) == GCA_OK && total)
        fprintf(stderr, "rank %d: verifier: %zu mismatches, first: %s of '%s' at op '%s'\n",
                rk->rank, total, gca_mismatch_kind_name(first.kind),
                first.buffer ? first.buffer : "?", first.op ? first.op : "?");
  }
  if (st == GCA_OK && rk->rank == 0 && c->snapshot_path) {
    st = write_snapshot(c->snapshot_path);
    if (st != GCA_OK)
      snprintf(res->error, sizeof(res->error), "rank 0: %s", tool_last_error());
  }
  rank_teardown(rk, st == GCA_OK);
  res->status = st;
}

static void *rank_thread(void *arg) {
  rank_main(arg);
  return NULL;
}

/* ---- results ---- */

static size_t align64(size_t n) {
  return (n + 63) & ~(size_t)63;
}

static gca_status_t results_alloc(const train_cfg_t *c, const train_model_t *m,
                                  train_results_t *r) {
  memset(r, 0, sizeof(*r));
  r->ranks = c->shape.ranks;
  r->steps = c->steps;
  r->shard_elems = m->shard_elems;
  r->layers = (size_t)c->shape.layers;
  size_t per = align64(sizeof(train_rank_result_t)) +
               align64((size_t)c->steps * sizeof(train_step_rec_t)) +
               align64(r->layers * r->shard_elems * sizeof(float));
  r->region_bytes =
      align64((size_t)r->ranks * sizeof(train_rank_result_t)) + per * (size_t)r->ranks;
  void *p = mmap(NULL, r->region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "no memory for the ranks' results (%zu bytes)",
                      r->region_bytes);
  r->region = p;
  r->rank = p;
  char *q = (char *)p + align64((size_t)r->ranks * sizeof(train_rank_result_t));
  for (int i = 0; i < r->ranks; i++) {
    train_rank_result_t *rr = &r->rank[i];
    rr->steps = (train_step_rec_t *)q;
    q += align64((size_t)c->steps * sizeof(train_step_rec_t));
    rr->params = (float *)q;
    q += align64(r->layers * r->shard_elems * sizeof(float));
    rr->status = GCA_ERR_INTERNAL;
    snprintf(rr->error, sizeof(rr->error), "rank %d did not report", i);
  }
  return GCA_OK;
}

void train_results_free(train_results_t *r) {
  if (r->region)
    munmap(r->region, r->region_bytes);
  memset(r, 0, sizeof(*r));
}

/* ---- ranks as threads or processes ---- */

static gca_status_t run_threads(const train_cfg_t *c, const train_model_t *models, int nshapes,
                                train_results_t *r) {
  int R = c->shape.ranks, devs[8] = {0};
  for (int i = 0; i < R; i++)
    devs[i] = i;
  gca_comm_options_t co = GCA_COMM_OPTIONS_INIT;
  co.timeout_s = c->timeout_s;
  gca_comm_t *comms[8] = {0};
  TOOL_CHECK_GCA(gca_comm_create_all(R, devs, &co, comms));
  rank_t rk[8];
  pthread_t th[8];
  meet_t meet = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .n = R};
  memset(rk, 0, sizeof(rk));
  int started = 0;
  for (int i = 0; i < R; i++) {
    rk[i] = (rank_t){.cfg = c,
                     .models = models,
                     .nshapes = nshapes,
                     .rank = i,
                     .device = i,
                     .meet = &meet,
                     .comm = comms[i],
                     .res = &r->rank[i]};
    rk[i].exec.m = &models[0];
    if (pthread_create(&th[i], NULL, rank_thread, &rk[i]) != 0) {
      snprintf(r->rank[i].error, sizeof(r->rank[i].error), "rank %d: no thread", i);
      for (int j = i; j < R; j++)
        (void)gca_comm_abort(comms[j]);
      break;
    }
    started++;
  }
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < started; i++)
    if (rk[i].comm)
      (void)gca_comm_destroy(rk[i].comm);
  return GCA_OK;
}

static gca_status_t run_processes(const train_cfg_t *c, const train_model_t *models, int nshapes,
                                  train_results_t *r) {
  int R = c->shape.ranks;
  gca_comm_id_t id;
  if (getrandom(id.bytes, sizeof(id.bytes), 0) != (ssize_t)sizeof(id.bytes))
    return tool_error(GCA_ERR_INTERNAL, "getrandom for the communicator's id failed");
  pid_t pid[8];
  fflush(NULL);
  int started = 0;
  for (int i = 0; i < R; i++) {
    pid[i] = fork();
    if (pid[i] < 0)
      break;
    if (pid[i] == 0) {
      gca_comm_options_t co = GCA_COMM_OPTIONS_INIT;
      co.timeout_s = c->timeout_s;
      co.sim_processes = true;
      rank_t rk = {.cfg = c,
                   .models = models,
                   .nshapes = nshapes,
                   .rank = i,
                   .device = 0,
                   .res = &r->rank[i]};
      rk.exec.m = &models[0];
      gca_status_t st = gca_comm_create(&id, R, i, 0, &co, &rk.comm);
      if (st != GCA_OK) {
        snprintf(rk.res->error, sizeof(rk.res->error), "rank %d: gca_comm_create: %s", i,
                 gca_last_error());
        rk.res->status = st;
        _exit(1);
      }
      rank_main(&rk);
      if (rk.comm)
        (void)gca_comm_destroy(rk.comm);
      fflush(NULL);
      _exit(rk.res->status == GCA_OK ? 0 : 1);
    }
    started++;
  }
  for (int i = 0; i < started; i++) {
    int ws = 0;
    if (waitpid(pid[i], &ws, 0) == pid[i] && WIFSIGNALED(ws)) {
      r->rank[i].status = GCA_ERR_INTERNAL;
      snprintf(r->rank[i].error, sizeof(r->rank[i].error), "rank %d: process killed by signal %d",
               i, WTERMSIG(ws));
    }
  }
  if (started < R)
    return tool_error(GCA_ERR_INTERNAL, "could not fork rank %d", started);
  return GCA_OK;
}

gca_status_t train_run(const train_cfg_t *c, train_results_t *r) {
  memset(r, 0, sizeof(*r));
  if (c->steps < 1 || c->steps > 100000)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "steps %d is not in 1..100000", c->steps);
  if (c->change_step < 0 || (c->change_step > 0 && c->change_batch == 0))
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "a batch change needs a step > 0 and a batch");
  if (!(c->time_scale >= 0))
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "time scale %g is negative", c->time_scale);
  train_model_t models[MAX_SHAPES];
  memset(models, 0, sizeof(models));
  int nshapes = c->change_step > 0 && c->change_step < c->steps ? 2 : 1;
  TOOL_CHECK(train_model_build(&c->shape, &models[0]));
  gca_status_t st = GCA_OK;
  if (nshapes == 2) {
    train_shape_t s2 = c->shape;
    s2.batch = c->change_batch;
    st = train_model_build(&s2, &models[1]);
  }
  if (st == GCA_OK)
    st = results_alloc(c, &models[0], r);
  if (st == GCA_OK)
    st = c->processes ? run_processes(c, models, nshapes, r) : run_threads(c, models, nshapes, r);
  if (c->fault && !c->processes)
    gca_sim_fault_clear(); /* armed here: it must not outlive the run, fired or not */
  for (int i = 0; i < nshapes; i++)
    train_model_free(&models[i]);
  if (st != GCA_OK)
    return st;
  /* the first failure, by rank, with its cause */
  for (int i = 0; i < r->ranks; i++)
    if (r->rank[i].status != GCA_OK && !strstr(r->rank[i].error, "abort") &&
        !strstr(r->rank[i].error, "a peer failed"))
      return tool_error(r->rank[i].status, "%s", r->rank[i].error);
  for (int i = 0; i < r->ranks; i++)
    if (r->rank[i].status != GCA_OK)
      return tool_error(r->rank[i].status, "%s", r->rank[i].error);
  return GCA_OK;
}
