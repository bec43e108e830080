/* SPDX-License-Identifier: Apache-2.0 */
/* sim_stream.h - the contract between the sim's streams (sim_stream.c), its
 * capture (sim_capture.c) and its graphs (sim_graph.c).
 *
 * One idea joins them: a unit of stream work (gca__sim_work_t) is a plain value
 * that either runs on a stream's worker or, while the stream captures, becomes
 * a graph node; a graph launch is itself a unit of work that runs its nodes.
 * Every submission goes through sim_stream.c, which asks sim_capture.c whether
 * the stream captures (a no-lock fast path when nothing captures anywhere).
 *
 * Note [Sim handles]: streams, events, graphs and executable graphs are handed
 * out as (kind, slot, generation) handles from one registry, so a destroyed,
 * stale or foreign handle is detected and refused instead of dereferenced.
 * Objects are reference counted; a registry lookup takes a reference.
 * GCA_SIM_RECYCLE_HANDLES=1 hands a new object the handle of the last one
 * destroyed, as the driver may (its handles are pointers to its own freed and
 * reused objects): what gca keeps keyed by a destroyed stream must then not
 * serve the new one (Note [Destroyed streams], allocator/streamkey.c). A
 * use of the old object through the handle then reaches the new one.
 */
#ifndef GCA_SIM_STREAM_H
#define GCA_SIM_STREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sim.h"

typedef enum gca__sim_kind {
  GCA__SIM_STREAM = 1,
  GCA__SIM_EVENT = 2,
  GCA__SIM_GRAPH = 3,
  GCA__SIM_EXEC = 4,
} gca__sim_kind_t;

/* Header of every registered object. refs >= 1 while registered or referenced. */
typedef struct gca__sim_obj {
  atomic_int refs;
  gca__sim_kind_t kind;
  void (*free_fn)(struct gca__sim_obj *obj);
} gca__sim_obj_t;

typedef struct gca__sim_image gca__sim_image_t; /* an immutable graph body (sim_graph.c) */

typedef enum gca__sim_work_kind {
  GCA__SIM_WORK_HOST,
  GCA__SIM_WORK_MEMCPY,
  GCA__SIM_WORK_MEMSET8,
  GCA__SIM_WORK_MEMSET32,
  GCA__SIM_WORK_FILL,
  GCA__SIM_WORK_ADD,
  GCA__SIM_WORK_SLEEP,
  GCA__SIM_WORK_GRAPH,
  GCA__SIM_WORK_PHILOX,
  GCA__SIM_WORK_COPY_BATCH, /* a: the table, count: its entries */
  GCA__SIM_WORK_GEMM,       /* dst: C, a, b; m, n, k; op: the GCA_GEMM_* flags */
  GCA__SIM_WORK_EW,         /* dst, a, b, count; op: the gca_ew_op_t; scale: s; value: u */
  GCA__SIM_WORK_DOT,        /* dst, a, b, count; scale: s */
} gca__sim_work_kind_t;

/* What one work item or graph node does. A GRAPH work holds a reference on its
 * image (taken by gca__sim_work_hold, dropped by gca__sim_work_release). */
typedef struct gca__sim_work {
  gca__sim_work_kind_t kind;
  gca_devptr_t dst, a, b; /* memcpy: dst <- a; add: dst = a + b */
  size_t count;           /* bytes (memcpy), elements (memset, kernels) */
  uint32_t value, step;
  uint64_t ns;
  gca_host_fn_t fn;
  void *user_data;
  gca__sim_image_t *graph;
  uint64_t offset; /* philox: added to *(u64 *)b; a is the seed's pointer */
  uint32_t op;     /* gemm: flags; ew: the op */
  uint32_t m, n, k;
  float scale;
  void *staged; /* memcpy from pageable host memory: the bytes read at the call (owned) */
} gca__sim_work_t;

/* Note [Sim memory faults]: work that touches memory that is not mapped
 * device memory (or, for a copy's host side, host memory) is not run; on a GPU
 * it faults the context. The first such fault of a stream is kept and every
 * later synchronize or query of the stream (or of an event recorded after it)
 * reports it, as the driver's sticky CUDA_ERROR_ILLEGAL_ADDRESS would, instead
 * of the worker crashing the process. Copies and memsets are checked at the
 * call already (GCA_ERR_INVALID_ARGUMENT); the run-time check catches what
 * changed since (memory unmapped before a replay, a kernel's bad pointer). */
typedef struct gca__sim_fault {
  const char *what; /* NULL: no fault */
  gca_devptr_t addr;
  size_t len;
} gca__sim_fault_t;

/* ---- sim_stream.c ---- */

/* Registers obj under a new handle; 0 when the registry cannot grow. */
uint64_t gca__sim_handle_add(gca__sim_obj_t *obj);
/* The live object of `kind` behind handle h with a reference taken, else NULL. */
gca__sim_obj_t *gca__sim_handle_get(gca__sim_kind_t kind, uint64_t h);
bool gca__sim_handle_was_live(gca__sim_kind_t kind, uint64_t h);
/* Unregisters h (the registry's reference is the caller's to drop). False when not live. */
bool gca__sim_handle_remove(gca__sim_kind_t kind, uint64_t h);
void gca__sim_obj_ref(gca__sim_obj_t *obj);
void gca__sim_obj_unref(gca__sim_obj_t *obj);

/* ---- sim_work.c ---- */

/* Runs one unit of work on the calling thread; work that would touch bad
 * memory is skipped and the first such fault kept in *fault. */
void gca__sim_work_run(const gca__sim_work_t *w, gca__sim_fault_t *fault);
/* Whether [p, p+len) is mapped device memory / host memory (not device address
 * space, and mapped in the process). */
bool gca__sim_is_device_mem(gca_devptr_t p, size_t len);
bool gca__sim_is_host_mem(gca_devptr_t p, size_t len);
void gca__sim_work_hold(const gca__sim_work_t *w);
void gca__sim_work_release(gca__sim_work_t *w);
/* Fills the table's work-making ops (host functions, copies, memsets, kernels). */
void gca__sim_work_ops(gca_device_ops_t *ops);

/* ---- sim_compute.c ---- */

/* Runs a GEMM, EW or DOT work item (memory already checked), in the order of
 * Note [Compute order] (device.h). */
void gca__sim_compute_run(const gca__sim_work_t *w);
/* The bytes a GEMM, EW or DOT work item touches through dst, a and b. */
gca__compute_span_t gca__sim_compute_span(const gca__sim_work_t *w);

/* ---- sim_stream.c ---- */

/* Note [Special streams] (device.h): replaces GCA_STREAM_LEGACY by NULL and
 * GCA_STREAM_PER_THREAD by the handle of the calling thread's per-thread
 * stream of its current device (created on first use); other handles stay.
 * Every op that takes a stream calls it first, so captures and launch order
 * see one handle per stream. */
gca_status_t gca__sim_stream_canon(const char *op, gca_stream_t *h);

/* Device, blocking-ness and legacy-ness of a stream (NULL: the legacy stream of
 * the calling thread's current device). GCA_ERR_INVALID_HANDLE naming `op` when
 * the stream is not live. */
gca_status_t gca__sim_stream_describe(const char *op, gca_stream_t stream, int *dev, bool *blocking,
                                      bool *legacy);
/* Queues (or, while the stream captures, records) a copy of w on the stream. */
gca_status_t gca__sim_stream_submit(const char *op, gca_stream_t stream, const gca__sim_work_t *w,
                                    bool *captured);
/* The same for a memcpy (Note [Sim copies], sim_work.c): `stage` reads a
 * pageable source at the call, `sync` returns once the copy has run. */
gca_status_t gca__sim_stream_submit_copy(const char *op, gca_stream_t stream,
                                         const gca__sim_work_t *w, bool stage, bool sync);

/* A position in a stream's work; complete once the work before it has run. */
typedef struct gca__sim_marker gca__sim_marker_t;
/* Marks the stream's current end (not while capturing); NULL on allocation failure. */
gca__sim_marker_t *gca__sim_stream_mark(gca_stream_t stream);
/* Makes later work on the stream wait for the marker. */
gca_status_t gca__sim_stream_wait_marker(const char *op, gca_stream_t stream, gca__sim_marker_t *m);
void gca__sim_marker_unref(gca__sim_marker_t *m);

/* ---- sim_graph.c ---- */

/* A node of a capture and of the image it becomes: deps[] sorted ascending,
 * every dep < the node's own index. */
typedef struct gca__sim_node {
  gca__sim_work_t work;
  size_t *deps;
  size_t ndeps;
} gca__sim_node_t;

void gca__sim_nodes_free(gca__sim_node_t *nodes, size_t n);
/* A graph handle for the nodes a capture made; takes them over (frees them
 * when it fails). */
gca_status_t gca__sim_graph_adopt(const char *op, gca__sim_node_t *nodes, size_t n,
                                  gca_graph_t *graph);

/* Runs an image's nodes, each once its dependencies are done, independent
 * branches concurrently (Note [Concurrent replay]); returns when all are done. */
void gca__sim_image_run(const gca__sim_image_t *img, gca__sim_fault_t *fault);
void gca__sim_image_ref(gca__sim_image_t *img);
void gca__sim_image_unref(gca__sim_image_t *img);

/* ---- sim_capture.c ---- */

/* Whether the stream takes part in a capture now. */
bool gca__sim_capture_has_stream(gca_stream_t s);
void gca__sim_capture_ops(gca_device_ops_t *ops);

/* Hooks called by sim_stream.c. Each returns GCA_OK with *captured false when
 * capture is not involved; with *captured true the capture took the operation;
 * otherwise the driver's error (the offending capture invalidated). */
gca_status_t gca__sim_capture_submit(const char *op, gca_stream_t s, int dev, bool legacy,
                                     const gca__sim_work_t *w, bool *captured);
gca_status_t gca__sim_capture_record(const char *op, gca_event_t e, gca_stream_t s, int dev,
                                     bool legacy, bool *captured);
gca_status_t gca__sim_capture_wait(const char *op, gca_stream_t s, int dev, bool blocking,
                                   bool legacy, gca_event_t e, bool event_recorded, bool *captured);
/* Stream synchronize/query: refused for a capturing stream, the legacy stream
 * of a device whose blocking streams capture, or an unsafe call. */
gca_status_t gca__sim_capture_check_stream(const char *op, gca_stream_t s, int dev, bool legacy);
/* Event synchronize/query: refused for an event last recorded in a capture or an unsafe call. */
gca_status_t gca__sim_capture_check_event(const char *op, gca_event_t e);
/* ctx_synchronize: refused while a stream of the device captures or an unsafe call. */
gca_status_t gca__sim_capture_check_device(const char *op, int dev);
/* A stream or event is being destroyed: it leaves any capture (which is invalidated). */
void gca__sim_capture_forget_stream(gca_stream_t s);
void gca__sim_capture_forget_event(gca_event_t e);

#endif
