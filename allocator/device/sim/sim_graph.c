/* SPDX-License-Identifier: Apache-2.0 */
/* sim_graph.c - the sim's graphs: the immutable body a capture leaves
 * (an image: nodes in capture order, each with its dependencies), its replay,
 * and the graph ops (node count, instantiate, upload, launch, exec-update,
 * destroy) following the driver's rules (cuGraphInstantiateWithFlags,
 * cuGraphLaunch, cuGraphExecUpdate_v2).
 *
 * The one idea: an image is shared, never changed, by a graph, the
 * executable graphs made from it and the launches in flight; a replay runs
 * each node once its dependencies are done, independent branches
 * concurrently (Note [Concurrent replay]). Captures are in sim_capture.c.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_stream.h"

/* ---- images (graph bodies) ---- */

typedef gca__sim_node_t node_t;

/* Immutable once built; shared by a graph, its execs and in-flight launches. */
struct gca__sim_image {
  atomic_int refs;
  size_t n;
  node_t *nodes;
};

void gca__sim_nodes_free(node_t *nodes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    gca__sim_work_release(&nodes[i].work);
    free(nodes[i].deps);
  }
  free(nodes);
}

void gca__sim_image_ref(gca__sim_image_t *img) {
  atomic_fetch_add(&img->refs, 1);
}

void gca__sim_image_unref(gca__sim_image_t *img) {
  if (img && atomic_fetch_sub(&img->refs, 1) == 1) {
    gca__sim_nodes_free(img->nodes, img->n);
    free(img);
  }
}

/* Note [Concurrent replay]: on a GPU the independent branches of a graph run
 * at the same time, so a replay runs a node as soon as its dependencies are
 * done, on as many threads as there are ready nodes: the launching worker
 * takes one ready node and starts a helper thread whenever more are ready and
 * no thread is idle to take them. A node blocked on another branch therefore
 * never keeps a ready node from starting. Without memory for the bookkeeping
 * or a thread, the replay falls back to capture order on fewer threads, which
 * still honours every dependency (capture order is topological). */
typedef struct replay {
  const gca__sim_image_t *img;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t *pending; /* per node: dependencies not yet done */
  size_t *succ;    /* successors of node i: succ[succ_at[i] .. succ_at[i + 1]) */
  size_t *succ_at;
  size_t *ready; /* a stack of runnable nodes */
  size_t nready, done;
  uint64_t start_vt; /* Note [Sim virtual time]: the launch's time; */
  uint64_t *end_vt;  /* per node: its end (its start: its dependencies' last end) */
  int idle, helpers;
  gca__sim_fault_t fault; /* the first node fault */
} replay_t;

static void *replay_loop(void *arg);

/* Takes ready nodes and runs them until every node is done; called with r->mu held. */
static void replay_drive(replay_t *r) {
  const gca__sim_image_t *img = r->img;
  while (r->done < img->n) {
    if (r->nready == 0) {
      r->idle++;
      pthread_cond_wait(&r->cv, &r->mu);
      r->idle--;
      continue;
    }
    size_t i = r->ready[--r->nready];
    if (r->nready > 0 && r->idle == 0) {
      pthread_t t;
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      if (pthread_create(&t, &attr, replay_loop, r) == 0)
        r->helpers++;
      pthread_attr_destroy(&attr);
    }
    uint64_t vt = r->start_vt;
    for (size_t k = 0; k < img->nodes[i].ndeps; k++)
      if (r->end_vt[img->nodes[i].deps[k]] > vt)
        vt = r->end_vt[img->nodes[i].deps[k]];
    pthread_mutex_unlock(&r->mu);
    gca__sim_fault_t f = {0};
    uint64_t *outer = gca__sim_clock_swap(&vt);
    gca__sim_work_run(&img->nodes[i].work, &f);
    gca__sim_clock_swap(outer);
    pthread_mutex_lock(&r->mu);
    r->end_vt[i] = vt;
    if (f.what && !r->fault.what)
      r->fault = f;
    r->done++;
    for (size_t k = r->succ_at[i]; k < r->succ_at[i + 1]; k++)
      if (--r->pending[r->succ[k]] == 0)
        r->ready[r->nready++] = r->succ[k];
    if (r->nready > 0 || r->done == img->n)
      pthread_cond_broadcast(&r->cv);
  }
}

static void *replay_loop(void *arg) {
  replay_t *r = arg;
  pthread_mutex_lock(&r->mu);
  replay_drive(r);
  r->helpers--;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

void gca__sim_image_run(const gca__sim_image_t *img, gca__sim_fault_t *fault) {
  size_t n = img->n, nedges = 0;
  for (size_t i = 0; i < n; i++)
    nedges += img->nodes[i].ndeps;
  replay_t r = {.img = img};
  r.pending = calloc(n + 1, sizeof(size_t));
  r.succ_at = calloc(n + 2, sizeof(size_t));
  r.succ = malloc((nedges + 1) * sizeof(size_t));
  r.ready = malloc((n + 1) * sizeof(size_t));
  r.end_vt = calloc(n + 1, sizeof(uint64_t));
  r.start_vt = gca__sim_clock_now();
  if (!r.pending || !r.succ_at || !r.succ || !r.ready || !r.end_vt) {
    for (size_t i = 0; i < n; i++)
      gca__sim_work_run(&img->nodes[i].work, fault);
    goto out;
  }
  /* successors by counting sort over the dependency lists */
  for (size_t i = 0; i < n; i++) {
    r.pending[i] = img->nodes[i].ndeps;
    for (size_t k = 0; k < img->nodes[i].ndeps; k++)
      r.succ_at[img->nodes[i].deps[k] + 2]++;
  }
  for (size_t i = 0; i < n; i++)
    r.succ_at[i + 2] += r.succ_at[i + 1];
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < img->nodes[i].ndeps; k++)
      r.succ[r.succ_at[img->nodes[i].deps[k] + 1]++] = i;
  for (size_t i = n; i-- > 0;)
    if (r.pending[i] == 0)
      r.ready[r.nready++] = i;
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.cv, NULL);
  pthread_mutex_lock(&r.mu);
  replay_drive(&r);
  while (r.helpers > 0)
    pthread_cond_wait(&r.cv, &r.mu);
  pthread_mutex_unlock(&r.mu);
  pthread_cond_destroy(&r.cv);
  pthread_mutex_destroy(&r.mu);
  if (r.fault.what && !fault->what)
    *fault = r.fault;
  for (size_t i = 0; i < n; i++)
    gca__sim_clock_advance_to(r.end_vt[i]);
out:
  free(r.end_vt);
  free(r.pending);
  free(r.succ_at);
  free(r.succ);
  free(r.ready);
}

typedef enum node_type { NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_HOST, NODE_GRAPH } node_type_t;

static node_type_t node_type(const gca__sim_work_t *w) {
  switch (w->kind) {
  case GCA__SIM_WORK_HOST:
    return NODE_HOST;
  case GCA__SIM_WORK_MEMCPY:
    return NODE_MEMCPY;
  case GCA__SIM_WORK_MEMSET8:
  case GCA__SIM_WORK_MEMSET32:
    return NODE_MEMSET;
  case GCA__SIM_WORK_GRAPH:
    return NODE_GRAPH;
  default:
    return NODE_KERNEL;
  }
}

static const char *node_name(const gca__sim_work_t *w) {
  switch (w->kind) {
  case GCA__SIM_WORK_HOST:
    return "host function";
  case GCA__SIM_WORK_MEMCPY:
    return "memcpy";
  case GCA__SIM_WORK_MEMSET8:
  case GCA__SIM_WORK_MEMSET32:
    return "memset";
  case GCA__SIM_WORK_FILL:
    return "kernel fill_u32";
  case GCA__SIM_WORK_ADD:
    return "kernel add_u32";
  case GCA__SIM_WORK_SLEEP:
    return "kernel sleep";
  case GCA__SIM_WORK_GRAPH:
    return "child graph";
  case GCA__SIM_WORK_PHILOX:
    return "kernel philox_u32";
  case GCA__SIM_WORK_COPY_BATCH:
    return "kernel copy_batch";
  case GCA__SIM_WORK_GEMM:
    return "kernel gemm_f32";
  case GCA__SIM_WORK_EW:
    return "kernel ew_f32";
  case GCA__SIM_WORK_DOT:
    return "kernel dot_f32";
  }
  return "node";
}

/* An operand's memory as cuGraphExecUpdate compares it: its memory type
 * (device or host) and, for device memory, its device (-1 when unmapped now). */
typedef struct operand {
  bool device;
  int dev;
} operand_t;

static operand_t operand_of(gca_devptr_t p, size_t len) {
  operand_t o = {.device = gca__sim_mem_in_device_space(p, len), .dev = -1};
  if (o.device)
    o.dev = gca__sim_mem_device_of(p, len);
  return o;
}

/* Whether an operand may change from a to b: same memory type (unless
 * `unified`), same device. A copy captured from memcpy_async names both sides
 * by unified address (CU_MEMORYTYPE_UNIFIED), so its memory type never
 * changes in the driver's eyes: an update that turns a device destination
 * into pinned host memory succeeds (H200, driver 580). */
static bool operand_same(const char *prefix, size_t i, const char *what, gca_devptr_t a,
                         gca_devptr_t b, size_t alen, size_t blen, bool unified,
                         gca_graph_update_info_t *info) {
  operand_t x = operand_of(a, alen), y = operand_of(b, blen);
  if (x.device != y.device && !unified) {
    info->result = GCA_GRAPH_UPDATE_PARAMETERS_CHANGED;
    snprintf(info->reason, sizeof(info->reason),
             "%snode %zu: the %s memory type changed (%s to %s)", prefix, i, what,
             x.device ? "device" : "host", y.device ? "device" : "host");
    return false;
  }
  if (x.device && x.dev >= 0 && y.dev >= 0 && x.dev != y.dev) {
    info->result = GCA_GRAPH_UPDATE_PARAMETERS_CHANGED;
    snprintf(info->reason, sizeof(info->reason), "%snode %zu: the %s moved from device %d to %d",
             prefix, i, what, x.dev, y.dev);
    return false;
  }
  return true;
}

/* Whether `to` can take `from`'s parameters, following cuGraphExecUpdate's
 * limitations as far as the sim's node kinds go: the same node count (else
 * TOPOLOGY_CHANGED with no error node), dependencies and node types; a kernel
 * may change its function (the sim's kernels are ordinary functions of one
 * context: no CDP, device-side launch or cooperative launch to differ in);
 * memcpy operands keep their device (their memory type may change: they are
 * unified addresses), memset targets their memory type and device
 * (PARAMETERS_CHANGED). Fills info on refusal. */
static bool image_compatible(const gca__sim_image_t *from, const gca__sim_image_t *to,
                             gca_graph_update_info_t *info, const char *prefix) {
  if (from->n != to->n) {
    info->result = GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED;
    info->error_node_index = SIZE_MAX;
    snprintf(info->reason, sizeof(info->reason), "%sthe graph has %zu nodes, the exec %zu", prefix,
             to->n, from->n);
    return false;
  }
  for (size_t i = 0; i < from->n; i++) {
    const node_t *a = &from->nodes[i], *b = &to->nodes[i];
    info->error_node_index = i;
    if (node_type(&a->work) != node_type(&b->work)) {
      info->result = GCA_GRAPH_UPDATE_NODE_TYPE_CHANGED;
      snprintf(info->reason, sizeof(info->reason), "%snode %zu: %s became %s", prefix, i,
               node_name(&a->work), node_name(&b->work));
      return false;
    }
    if (a->ndeps != b->ndeps ||
        (a->ndeps > 0 && memcmp(a->deps, b->deps, a->ndeps * sizeof(*a->deps)) != 0)) {
      info->result = GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED;
      snprintf(info->reason, sizeof(info->reason), "%snode %zu (%s): its dependencies changed",
               prefix, i, node_name(&a->work));
      return false;
    }
    if (node_type(&a->work) == NODE_MEMCPY &&
        (!operand_same(prefix, i, "memcpy destination", a->work.dst, b->work.dst, a->work.count,
                       b->work.count, true, info) ||
         !operand_same(prefix, i, "memcpy source", a->work.a, b->work.a, a->work.count,
                       b->work.count, true, info)))
      return false;
    if (node_type(&a->work) == NODE_MEMSET) {
      size_t an = a->work.kind == GCA__SIM_WORK_MEMSET32 ? a->work.count * 4 : a->work.count;
      size_t bn = b->work.kind == GCA__SIM_WORK_MEMSET32 ? b->work.count * 4 : b->work.count;
      if (!operand_same(prefix, i, "memset target", a->work.dst, b->work.dst, an, bn, false, info))
        return false;
    }
    if (node_type(&a->work) == NODE_GRAPH) {
      char sub[64];
      snprintf(sub, sizeof(sub), "%snode %zu (child graph): ", prefix, i);
      if (!image_compatible(a->work.graph, b->work.graph, info, sub)) {
        info->error_node_index = i;
        return false;
      }
    }
  }
  return true;
}

/* ---- graphs ---- */

typedef struct sim_graph {
  gca__sim_obj_t obj;
  uint64_t handle;
  gca__sim_image_t *img;
} sim_graph_t;

static void graph_free(gca__sim_obj_t *obj) {
  sim_graph_t *g = (sim_graph_t *)obj;
  gca__sim_image_unref(g->img);
  free(g);
}

/* A graph of the nodes a capture made (taken over, freed on failure). */
gca_status_t gca__sim_graph_adopt(const char *op, node_t *nodes, size_t n, gca_graph_t *graph) {
  sim_graph_t *g = calloc(1, sizeof(*g));
  gca__sim_image_t *img = calloc(1, sizeof(*img));
  if (!g || !img) {
    free(g);
    free(img);
    gca__sim_nodes_free(nodes, n);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a graph", op);
  }
  atomic_init(&img->refs, 1);
  img->n = n;
  img->nodes = nodes;
  atomic_init(&g->obj.refs, 1);
  g->obj.kind = GCA__SIM_GRAPH;
  g->obj.free_fn = graph_free;
  g->img = img;
  g->handle = gca__sim_handle_add(&g->obj);
  if (!g->handle) {
    graph_free(&g->obj);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: the handle registry is full", op);
  }
  *graph = (gca_graph_t)(uintptr_t)g->handle;
  return GCA_OK;
}

/* ---- graph ops ---- */

/* last_launch marks the end of the latest launch outside capture (on
 * last_stream), so that launches of the same exec are ordered across streams. */
typedef struct sim_exec {
  gca__sim_obj_t obj;
  uint64_t handle;
  pthread_mutex_t mu;
  gca__sim_image_t *img;
  gca__sim_marker_t *last_launch;
  gca_stream_t last_stream;
} sim_exec_t;

static void exec_free(gca__sim_obj_t *obj) {
  sim_exec_t *x = (sim_exec_t *)obj;
  gca__sim_image_unref(x->img);
  gca__sim_marker_unref(x->last_launch);
  pthread_mutex_destroy(&x->mu);
  free(x);
}

static gca_status_t graph_get(const char *op, gca_graph_t h, sim_graph_t **out) {
  gca__sim_obj_t *obj = h ? gca__sim_handle_get(GCA__SIM_GRAPH, (uint64_t)(uintptr_t)h) : NULL;
  if (!obj)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: graph %p is not a live graph", op, (void *)h);
  *out = (sim_graph_t *)obj;
  return GCA_OK;
}

static gca_status_t exec_get(const char *op, gca_graph_exec_t h, sim_exec_t **out) {
  gca__sim_obj_t *obj = h ? gca__sim_handle_get(GCA__SIM_EXEC, (uint64_t)(uintptr_t)h) : NULL;
  if (!obj)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: exec %p is not a live executable graph", op,
                      (void *)h);
  *out = (sim_exec_t *)obj;
  return GCA_OK;
}

static gca_status_t sim_graph_node_count(gca_graph_t graph, size_t *count) {
  GCA_SIM_ENTER(graph_node_count, 0);
  sim_graph_t *g = NULL;
  if (!count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_node_count: count is NULL");
  GCA_CHECK(graph_get("graph_node_count", graph, &g));
  *count = g->img->n;
  gca__sim_obj_unref(&g->obj);
  return GCA_OK;
}

static gca_status_t sim_graph_instantiate(gca_graph_t graph, gca_graph_exec_t *out) {
  GCA_SIM_ENTER(graph_instantiate, 0);
  sim_graph_t *g = NULL;
  gca_status_t st = GCA_OK;
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_instantiate: out is NULL");
  GCA_CHECK(graph_get("graph_instantiate", graph, &g));
  sim_exec_t *x = calloc(1, sizeof(*x));
  if (!x) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_instantiate: no host memory for an exec");
    goto out;
  }
  atomic_init(&x->obj.refs, 1);
  x->obj.kind = GCA__SIM_EXEC;
  x->obj.free_fn = exec_free;
  pthread_mutex_init(&x->mu, NULL);
  gca__sim_image_ref(g->img);
  x->img = g->img;
  x->handle = gca__sim_handle_add(&x->obj);
  if (!x->handle) {
    exec_free(&x->obj);
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_instantiate: the handle registry is full");
    goto out;
  }
  *out = (gca_graph_exec_t)(uintptr_t)x->handle;
out:
  gca__sim_obj_unref(&g->obj);
  return st;
}

static gca_status_t sim_graph_upload(gca_graph_exec_t exec, gca_stream_t stream) {
  GCA_SIM_ENTER(graph_upload, 0);
  GCA_CHECK(gca__sim_stream_canon("graph_upload", &stream));
  sim_exec_t *x = NULL;
  int dev;
  bool blocking, legacy;
  GCA_CHECK(exec_get("graph_upload", exec, &x));
  gca_status_t st = gca__sim_stream_describe("graph_upload", stream, &dev, &blocking, &legacy);
  gca__sim_obj_unref(&x->obj);
  return st;
}

static gca_status_t sim_graph_launch(gca_graph_exec_t exec, gca_stream_t stream) {
  GCA_SIM_ENTER(graph_launch, 0);
  GCA_CHECK(gca__sim_stream_canon("graph_launch", &stream));
  sim_exec_t *x = NULL;
  gca_status_t st;
  GCA_CHECK(exec_get("graph_launch", exec, &x));
  pthread_mutex_lock(&x->mu);
  gca__sim_work_t w = {.kind = GCA__SIM_WORK_GRAPH, .graph = x->img};
  gca__sim_image_ref(w.graph);
  bool capturing = gca__sim_capture_has_stream(stream);
  if (!capturing && x->last_launch && (x->last_stream != stream || !stream))
    GCA_CHECK_GOTO(gca__sim_stream_wait_marker("graph_launch", stream, x->last_launch), st, out);
  bool captured = false;
  GCA_CHECK_GOTO(gca__sim_stream_submit("graph_launch", stream, &w, &captured), st, out);
  if (!captured) {
    gca__sim_marker_t *m = gca__sim_stream_mark(stream);
    if (m) {
      gca__sim_marker_unref(x->last_launch);
      x->last_launch = m;
      x->last_stream = stream;
    }
  }
out:
  pthread_mutex_unlock(&x->mu);
  gca__sim_work_release(&w);
  gca__sim_obj_unref(&x->obj);
  return st;
}

static gca_status_t sim_graph_exec_update(gca_graph_exec_t exec, gca_graph_t graph,
                                          gca_graph_update_info_t *info) {
  GCA_SIM_ENTER(graph_exec_update, 0);
  sim_exec_t *x = NULL;
  sim_graph_t *g = NULL;
  gca_status_t st = GCA_OK;
  if (!info)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_exec_update: info is NULL");
  GCA_CHECK(exec_get("graph_exec_update", exec, &x));
  GCA_CHECK_GOTO(graph_get("graph_exec_update", graph, &g), st, fail_graph);
  *info =
      (gca_graph_update_info_t){.result = GCA_GRAPH_UPDATE_SUCCESS, .error_node_index = SIZE_MAX};
  pthread_mutex_lock(&x->mu);
  if (image_compatible(x->img, g->img, info, "")) {
    info->error_node_index = SIZE_MAX;
    gca__sim_image_ref(g->img);
    gca__sim_image_unref(x->img);
    x->img = g->img;
  } else {
    st = gca__error(GCA_ERR_GRAPH_UPDATE, "graph_exec_update: exec %p cannot take graph %p: %s",
                    (void *)exec, (void *)graph, info->reason);
  }
  pthread_mutex_unlock(&x->mu);
  gca__sim_obj_unref(&g->obj);
fail_graph:
  gca__sim_obj_unref(&x->obj);
  return st;
}

static gca_status_t sim_graph_destroy(gca_graph_t graph) {
  GCA_SIM_ENTER(graph_destroy, 0);
  sim_graph_t *g = NULL;
  GCA_CHECK(graph_get("graph_destroy", graph, &g));
  if (!gca__sim_handle_remove(GCA__SIM_GRAPH, g->handle)) {
    gca__sim_obj_unref(&g->obj);
    return gca__error(GCA_ERR_INVALID_HANDLE, "graph_destroy: graph %p is not a live graph",
                      (void *)graph);
  }
  gca__sim_obj_unref(&g->obj);
  gca__sim_obj_unref(&g->obj);
  return GCA_OK;
}

static gca_status_t sim_graph_exec_destroy(gca_graph_exec_t exec) {
  GCA_SIM_ENTER(graph_exec_destroy, 0);
  sim_exec_t *x = NULL;
  GCA_CHECK(exec_get("graph_exec_destroy", exec, &x));
  if (!gca__sim_handle_remove(GCA__SIM_EXEC, x->handle)) {
    gca__sim_obj_unref(&x->obj);
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "graph_exec_destroy: exec %p is not a live executable graph", (void *)exec);
  }
  gca__sim_obj_unref(&x->obj);
  gca__sim_obj_unref(&x->obj);
  return GCA_OK;
}
void gca__sim_graph_ops(gca_device_ops_t *ops) {
  gca__sim_capture_ops(ops);
  ops->graph_node_count = sim_graph_node_count;
  ops->graph_instantiate = sim_graph_instantiate;
  ops->graph_upload = sim_graph_upload;
  ops->graph_launch = sim_graph_launch;
  ops->graph_exec_update = sim_graph_exec_update;
  ops->graph_destroy = sim_graph_destroy;
  ops->graph_exec_destroy = sim_graph_exec_destroy;
}
