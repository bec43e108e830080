/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_graph.c - stream capture and graphs on the cuda backend: capture's
 * begin, end, status and the thread's capture mode; graphs' instantiate,
 * upload, launch, update and destroy.
 *
 * The one idea: each op is one driver call in the stream's context, or for a
 * graph in whatever context is current; an update the driver rejects is
 * reported with the rejected node's position in the graph and the reason.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#ifdef GCA_CUDA_FULL

/* ---- capture ---- */

static gca_status_t cuda_stream_begin_capture(gca_stream_t stream, gca_capture_mode_t mode) {
  GCA_CHECK(gca__cuda_enter_stream("stream_begin_capture", stream, NULL));
  gca_status_t st;
  gca__capture_enter(); /* Note [Capture gate] */
  CU_CHECK_GOTO("stream_begin_capture",
                gca__cuda_drv.StreamBeginCapture(stream, (CUstreamCaptureMode)mode), st, fail);
  return GCA_OK;
fail:
  gca__capture_abandon();
  return st;
}

/* Note [Invalidated captures]: the driver refuses cuStreamGetCtx on a stream
 * whose capture was invalidated (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, seen
 * on an H200 with driver 580), while cuStreamGetCaptureInfo still reports the
 * status and cuStreamEndCapture still ends the sequence. A stream names its
 * own context, so those two are made without making it current; refusing
 * them would leave the capture open for good, and every later unsafe call of
 * a global-mode capture refused. */
static gca_status_t enter_capturing(const char *op, gca_stream_t stream) {
  gca_status_t st = gca__cuda_enter_stream(op, stream, NULL);
  return st == GCA_ERR_CAPTURE_INVALIDATED ? GCA_OK : st;
}

static gca_status_t cuda_stream_capture_info(gca_stream_t stream, gca_capture_status_t *status,
                                             uint64_t *id);

static gca_status_t cuda_stream_end_capture(gca_stream_t stream, gca_graph_t *graph) {
  if (!graph)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_end_capture: graph is NULL");
  GCA_CHECK(enter_capturing("stream_end_capture", stream));
  gca_capture_status_t before = GCA_CAPTURE_STATUS_NONE, after = GCA_CAPTURE_STATUS_NONE;
  bool known = cuda_stream_capture_info(stream, &before, NULL) == GCA_OK;
  CUgraph g = NULL;
  CUresult r = gca__cuda_drv.StreamEndCapture(stream, &g);
  *graph = g; /* NULL when it failed, as the driver leaves it */
  /* the sequence is over once the stream no longer captures, whatever the result */
  if (known && before != GCA_CAPTURE_STATUS_NONE &&
      cuda_stream_capture_info(stream, &after, NULL) == GCA_OK && after == GCA_CAPTURE_STATUS_NONE)
    atomic_fetch_sub(&gca__device_captures, 1);
  /* the driver's answer for a stream that is not capturing (cuda.h lists
   * CUDA_ERROR_STREAM_CAPTURE_UNMATCHED for a mismatched end) */
  if (r == CUDA_ERROR_ILLEGAL_STATE && known && before == GCA_CAPTURE_STATUS_NONE)
    return gca__error(GCA_ERR_CAPTURE_UNMATCHED,
                      "stream_end_capture: stream %p is not capturing (CUDA_ERROR_ILLEGAL_STATE)",
                      (void *)stream);
  CU_CHECK("stream_end_capture", r);
  return GCA_OK;
}

static gca_status_t cuda_stream_capture_info(gca_stream_t stream, gca_capture_status_t *status,
                                             uint64_t *id) {
  GCA_CHECK(enter_capturing("stream_capture_info", stream));
  if (!status)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_capture_info: status is NULL");
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  if (gca__cuda_drv.StreamGetCaptureInfo_v3)
    CU_CHECK("stream_capture_info",
             gca__cuda_drv.StreamGetCaptureInfo_v3(stream, &cs, &cid, NULL, NULL, NULL, NULL));
  else
    CU_CHECK("stream_capture_info",
             gca__cuda_drv.StreamGetCaptureInfo_v2(stream, &cs, &cid, NULL, NULL, NULL));
  *status = (gca_capture_status_t)cs;
  if (id)
    *id = cid;
  return GCA_OK;
}

static gca_status_t cuda_thread_exchange_capture_mode(gca_capture_mode_t *mode) {
  GCA_CHECK(gca__cuda_ready("thread_exchange_capture_mode"));
  if (!mode)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "thread_exchange_capture_mode: mode is NULL");
  CUstreamCaptureMode m = (CUstreamCaptureMode)*mode;
  CU_CHECK("thread_exchange_capture_mode", gca__cuda_drv.ThreadExchangeStreamCaptureMode(&m));
  *mode = (gca_capture_mode_t)m;
  return GCA_OK;
}

/* ---- graphs ---- */

static gca_status_t cuda_graph_node_count(gca_graph_t graph, size_t *count) {
  if (!count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_node_count: count is NULL");
  GCA_CHECK(gca__cuda_enter_any("graph_node_count"));
  size_t n = 0;
  CU_CHECK("graph_node_count", gca__cuda_drv.GraphGetNodes(graph, NULL, &n));
  *count = n;
  return GCA_OK;
}

static gca_status_t cuda_graph_instantiate(gca_graph_t graph, gca_graph_exec_t *out) {
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_instantiate: out is NULL");
  GCA_CHECK(gca__cuda_enter_any("graph_instantiate"));
  CUgraphExec e = NULL;
  CU_CHECK("graph_instantiate", gca__cuda_drv.GraphInstantiateWithFlags(&e, graph, 0));
  *out = e;
  return GCA_OK;
}

static gca_status_t cuda_graph_upload(gca_graph_exec_t exec, gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("graph_upload", stream, NULL));
  if (!gca__cuda_drv.GraphUpload)
    return gca__error(GCA_ERR_NOT_SUPPORTED, "graph_upload: the driver lacks cuGraphUpload");
  CU_CHECK("graph_upload", gca__cuda_drv.GraphUpload(exec, stream));
  return GCA_OK;
}

static gca_status_t cuda_graph_launch(gca_graph_exec_t exec, gca_stream_t stream) {
  GCA_CHECK(gca__cuda_enter_stream("graph_launch", stream, NULL));
  CU_CHECK("graph_launch", gca__cuda_drv.GraphLaunch(exec, stream));
  return GCA_OK;
}

static const char *update_result_text(CUgraphExecUpdateResult r) {
  switch (r) {
  case CU_GRAPH_EXEC_UPDATE_SUCCESS:
    return "success";
  case CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED:
    return "topology changed";
  case CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED:
    return "node type changed";
  case CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED:
    return "kernel function changed";
  case CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE:
    return "kernel function changed in an unsupported way";
  case CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED:
    return "parameters changed in an unsupported way";
  case CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED:
    return "node not supported by update";
  case CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED:
    return "node attributes changed";
  default:
    return "update failed";
  }
}

static gca_graph_update_result_t update_result(CUgraphExecUpdateResult r) {
  switch (r) {
  case CU_GRAPH_EXEC_UPDATE_SUCCESS:
    return GCA_GRAPH_UPDATE_SUCCESS;
  case CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED:
    return GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED:
    return GCA_GRAPH_UPDATE_NODE_TYPE_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED:
    return GCA_GRAPH_UPDATE_FUNCTION_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE:
    return GCA_GRAPH_UPDATE_UNSUPPORTED_FUNCTION_CHANGE;
  case CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED:
    return GCA_GRAPH_UPDATE_PARAMETERS_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED:
    return GCA_GRAPH_UPDATE_ATTRIBUTES_CHANGED;
  case CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED:
    return GCA_GRAPH_UPDATE_NOT_SUPPORTED;
  default:
    return GCA_GRAPH_UPDATE_ERROR;
  }
}

/* Position of `node` in cuGraphGetNodes' order of `graph`, or SIZE_MAX. */
static size_t node_index(CUgraph graph, CUgraphNode node) {
  size_t n = 0, idx = SIZE_MAX;
  if (!node || gca__cuda_drv.GraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS || n == 0)
    return SIZE_MAX;
  CUgraphNode *nodes = calloc(n, sizeof(*nodes));
  if (!nodes)
    return SIZE_MAX;
  if (gca__cuda_drv.GraphGetNodes(graph, nodes, &n) == CUDA_SUCCESS) {
    for (size_t i = 0; i < n; i++) {
      if (nodes[i] == node) {
        idx = i;
        break;
      }
    }
  }
  free(nodes);
  return idx;
}

static gca_status_t cuda_graph_exec_update(gca_graph_exec_t exec, gca_graph_t graph,
                                           gca_graph_update_info_t *info) {
  GCA_CHECK(gca__cuda_enter_any("graph_exec_update"));
  CUgraphExecUpdateResultInfo ri;
  memset(&ri, 0, sizeof(ri));
  CUresult r = gca__cuda_drv.GraphExecUpdate(exec, graph, &ri);
  size_t idx = SIZE_MAX;
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
    idx = node_index(graph, ri.errorNode);
  if (info) {
    info->result = r == CUDA_SUCCESS ? GCA_GRAPH_UPDATE_SUCCESS : update_result(ri.result);
    info->error_node_index = idx;
    if (r == CUDA_SUCCESS)
      info->reason[0] = '\0';
    else if (idx != SIZE_MAX)
      snprintf(info->reason, sizeof(info->reason), "node %zu: %s", idx,
               update_result_text(ri.result));
    else
      snprintf(info->reason, sizeof(info->reason), "%s", update_result_text(ri.result));
  }
  if (r == CUDA_SUCCESS)
    return GCA_OK;
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
    if (idx != SIZE_MAX)
      return gca__error(GCA_ERR_GRAPH_UPDATE, "graph_exec_update: rejected at node %zu: %s", idx,
                        update_result_text(ri.result));
    return gca__error(GCA_ERR_GRAPH_UPDATE, "graph_exec_update: rejected: %s",
                      update_result_text(ri.result));
  }
  return gca__cuda_error("graph_exec_update", r);
}

static gca_status_t cuda_graph_destroy(gca_graph_t graph) {
  GCA_CHECK(gca__cuda_enter_any("graph_destroy"));
  CU_CHECK("graph_destroy", gca__cuda_drv.GraphDestroy(graph));
  return GCA_OK;
}

static gca_status_t cuda_graph_exec_destroy(gca_graph_exec_t exec) {
  GCA_CHECK(gca__cuda_enter_any("graph_exec_destroy"));
  CU_CHECK("graph_exec_destroy", gca__cuda_drv.GraphExecDestroy(exec));
  return GCA_OK;
}

void gca__cuda_graph_ops(gca_device_ops_t *ops) {
  ops->stream_begin_capture = cuda_stream_begin_capture;
  ops->stream_end_capture = cuda_stream_end_capture;
  ops->stream_capture_info = cuda_stream_capture_info;
  ops->thread_exchange_capture_mode = cuda_thread_exchange_capture_mode;
  ops->graph_node_count = cuda_graph_node_count;
  ops->graph_instantiate = cuda_graph_instantiate;
  ops->graph_upload = cuda_graph_upload;
  ops->graph_launch = cuda_graph_launch;
  ops->graph_exec_update = cuda_graph_exec_update;
  ops->graph_destroy = cuda_graph_destroy;
  ops->graph_exec_destroy = cuda_graph_exec_destroy;
}

#endif /* GCA_CUDA_FULL */
