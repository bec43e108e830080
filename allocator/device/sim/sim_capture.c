/* SPDX-License-Identifier: Apache-2.0 */
/* sim_capture.c - the sim's stream capture, following the driver's rules
 * (cuStreamBeginCapture_v2, cuStreamEndCapture, cuStreamGetCaptureInfo,
 * cuThreadExchangeStreamCaptureMode, "Prohibited and Unhandled Operations").
 *
 * The one idea: a capture is a growing list of nodes plus, per participating
 * stream, its "tail" (the nodes the stream's next work depends on). Work given
 * to a capturing stream becomes a node depending on the tail and becomes the
 * new tail; an event recorded there remembers the tail; a stream waiting on
 * such an event joins the capture (fork) or adds the event's nodes to its tail
 * (join). Nodes are appended in capture order, which is therefore a
 * topological order; the end of a capture hands them to sim_graph.c as a
 * graph.
 *
 * Note [Capture-unsafe calls] (sim.h) is implemented by capture_unsafe():
 * a thread in GLOBAL mode may not make unsafe calls while it has an ongoing
 * non-relaxed capture or another thread has a GLOBAL one; THREAD_LOCAL only
 * looks at its own captures; RELAXED never refuses. A refused call
 * invalidates the captures that caused the refusal; an invalidated capture
 * refuses all further capture work and its end returns no graph.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_stream.h"

typedef gca__sim_node_t node_t;

/* ---- index sets ---- */

typedef struct idxs {
  size_t *v;
  size_t n, cap;
} idxs_t;

static bool idxs_add(idxs_t *x, size_t i) {
  for (size_t k = 0; k < x->n; k++)
    if (x->v[k] == i)
      return true;
  if (x->n == x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 4;
    size_t *v = realloc(x->v, cap * sizeof(*v));
    if (!v)
      return false;
    x->v = v;
    x->cap = cap;
  }
  x->v[x->n++] = i;
  return true;
}

static bool idxs_union(idxs_t *x, const idxs_t *y) {
  for (size_t k = 0; k < y->n; k++)
    if (!idxs_add(x, y->v[k]))
      return false;
  return true;
}

static void idxs_free(idxs_t *x) {
  free(x->v);
  *x = (idxs_t){0};
}

static int cmp_size(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- captures ---- */

typedef struct cap_stream {
  gca_stream_t s;
  int dev;
  bool blocking;
  idxs_t tail;
} cap_stream_t;

/* streams[0] is the origin; nodes[i].deps only name nodes < i; every stream
 * takes part in at most one capture. */
typedef struct capture {
  struct capture *next;
  uint64_t id;
  gca_capture_mode_t mode;
  pthread_t thread;
  bool invalidated;
  node_t *nodes;
  size_t n, cap;
  cap_stream_t *streams;
  size_t nstreams, capstreams;
} capture_t;

/* An event last recorded in a capturing stream: the tail it saw. cap is NULL
 * once that capture has ended (Note [Captured events]). */
typedef struct cap_event {
  struct cap_event *next;
  gca_event_t e;
  capture_t *cap;
  idxs_t nodes;
} cap_event_t;

/* Note [Captured events]: an event whose last record was captured is
 * "captured". While its capture goes on, querying or synchronizing it fails
 * with CUDA_ERROR_CAPTURED_EVENT and invalidates the capture. Once the capture
 * has ended, the driver refuses the event with CUDA_ERROR_INVALID_VALUE
 * (query, synchronize, and a stream's wait on it; seen on an H200 with driver
 * 580), until it is recorded again outside a capture. */

static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static capture_t *captures;
static cap_event_t *cap_events;
static atomic_int ncaptures; /* lets the common case (nothing captures) skip cap_mu */
static atomic_int norphans;  /* cap_events whose capture ended (cap NULL) */
static atomic_uint_fast64_t last_capture_id;
static _Thread_local gca_capture_mode_t thread_mode = GCA_CAPTURE_MODE_GLOBAL;

static const char *mode_name(gca_capture_mode_t m) {
  return m == GCA_CAPTURE_MODE_GLOBAL         ? "global"
         : m == GCA_CAPTURE_MODE_THREAD_LOCAL ? "thread-local"
                                              : "relaxed";
}

static cap_stream_t *find_stream(gca_stream_t s, capture_t **cap_out) {
  for (capture_t *c = captures; c; c = c->next)
    for (size_t i = 0; i < c->nstreams; i++)
      if (c->streams[i].s == s) {
        *cap_out = c;
        return &c->streams[i];
      }
  return NULL;
}

static cap_event_t **find_event(gca_event_t e) {
  for (cap_event_t **p = &cap_events; *p; p = &(*p)->next)
    if ((*p)->e == e)
      return p;
  return NULL;
}

/* Whether cap_mu must be taken to learn about events and captures. */
static bool capture_state_empty(void) {
  return atomic_load(&ncaptures) == 0 && atomic_load(&norphans) == 0;
}

static void event_drop(cap_event_t **p) {
  cap_event_t *ce = *p;
  if (!ce->cap)
    atomic_fetch_sub(&norphans, 1);
  *p = ce->next;
  idxs_free(&ce->nodes);
  free(ce);
}

static void capture_remove(capture_t *c) {
  for (capture_t **p = &captures; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  for (cap_event_t *ce = cap_events; ce; ce = ce->next) {
    if (ce->cap == c) {
      ce->cap = NULL; /* Note [Captured events] */
      idxs_free(&ce->nodes);
      atomic_fetch_add(&norphans, 1);
    }
  }
  for (size_t i = 0; i < c->nstreams; i++)
    idxs_free(&c->streams[i].tail);
  free(c->streams);
  gca__sim_nodes_free(c->nodes, c->n);
  free(c);
  atomic_fetch_sub(&ncaptures, 1);
  atomic_fetch_sub(&gca__device_captures, 1);
}

/* Whether a capture holds a blocking stream of dev (true: the first in *first);
 * with `invalidate`, every such capture is invalidated. */
static bool legacy_blocked(int dev, bool invalidate, capture_t **first) {
  bool any = false;
  for (capture_t *c = captures; c; c = c->next)
    for (size_t i = 0; i < c->nstreams; i++)
      if (c->streams[i].dev == dev && c->streams[i].blocking) {
        if (!any)
          *first = c;
        if (invalidate)
          c->invalidated = true;
        any = true;
        break;
      }
  return any;
}

/* Using the legacy stream invalidates every capture holding a blocking stream of dev. */
static bool legacy_conflict(int dev, capture_t **first) {
  return legacy_blocked(dev, true, first);
}

static gca_status_t implicit_error(const char *op, int dev, capture_t *c) {
  return gca__error(GCA_ERR_CAPTURE_IMPLICIT,
                    "%s: the legacy stream of device %d is used while its blocking stream %p "
                    "captures (capture %llu, now invalidated)",
                    op, dev, (void *)c->streams[0].s, (unsigned long long)c->id);
}

static gca_status_t invalidated_error(const char *op, capture_t *c) {
  return gca__error(GCA_ERR_CAPTURE_INVALIDATED,
                    "%s: capture %llu (begun on stream %p) was invalidated by an earlier error", op,
                    (unsigned long long)c->id, (void *)c->streams[0].s);
}

/* Note [Capture-unsafe calls]; called with cap_mu held. */
static gca_status_t capture_unsafe(const char *op) {
  gca_capture_mode_t mode = thread_mode;
  pthread_t self = pthread_self();
  capture_t *culprit = NULL;
  for (capture_t *c = captures; c; c = c->next) {
    bool own = pthread_equal(c->thread, self);
    if ((mode != GCA_CAPTURE_MODE_RELAXED && own && c->mode != GCA_CAPTURE_MODE_RELAXED) ||
        (mode == GCA_CAPTURE_MODE_GLOBAL && !own && c->mode == GCA_CAPTURE_MODE_GLOBAL)) {
      c->invalidated = true;
      if (!culprit)
        culprit = c;
    }
  }
  if (!culprit)
    return GCA_OK;
  return gca__error(GCA_ERR_CAPTURE_UNSUPPORTED,
                    "%s: not permitted while stream %p captures in %s mode on %s thread (this "
                    "thread's mode: %s); capture %llu is invalidated",
                    op, (void *)culprit->streams[0].s, mode_name(culprit->mode),
                    pthread_equal(culprit->thread, self) ? "this" : "another", mode_name(mode),
                    (unsigned long long)culprit->id);
}

gca_status_t gca__sim_capture_check_unsafe(const char *op) {
  if (atomic_load(&ncaptures) == 0)
    return GCA_OK;
  pthread_mutex_lock(&cap_mu);
  gca_status_t st = capture_unsafe(op);
  pthread_mutex_unlock(&cap_mu);
  return st;
}

gca_status_t gca__sim_capture_check_stream(const char *op, gca_stream_t s, int dev, bool legacy) {
  if (atomic_load(&ncaptures) == 0)
    return GCA_OK;
  gca_status_t st = GCA_OK;
  capture_t *c = NULL;
  pthread_mutex_lock(&cap_mu);
  if ((st = capture_unsafe(op)) != GCA_OK)
    goto out;
  if (legacy && legacy_conflict(dev, &c)) {
    st = implicit_error(op, dev, c);
  } else if (find_stream(s, &c)) {
    c->invalidated = true;
    st = gca__error(GCA_ERR_CAPTURE_UNSUPPORTED,
                    "%s: stream %p is capturing (capture %llu, now invalidated)", op, (void *)s,
                    (unsigned long long)c->id);
  }
out:
  pthread_mutex_unlock(&cap_mu);
  return st;
}

static gca_status_t orphan_error(const char *op, gca_event_t e) {
  return gca__error(GCA_ERR_INVALID_ARGUMENT,
                    "%s: event %p was last recorded in a capture that has ended "
                    "(CUDA_ERROR_INVALID_VALUE); record it again outside a capture first",
                    op, (void *)e);
}

gca_status_t gca__sim_capture_check_event(const char *op, gca_event_t e) {
  if (capture_state_empty())
    return GCA_OK;
  gca_status_t st;
  pthread_mutex_lock(&cap_mu);
  cap_event_t **p = find_event(e);
  if (p && !(*p)->cap) {
    st = orphan_error(op, e);
  } else if (p) {
    (*p)->cap->invalidated = true;
    st = gca__error(GCA_ERR_DRIVER,
                    "%s: event %p was last recorded in a capturing stream "
                    "(CUDA_ERROR_CAPTURED_EVENT); capture %llu is invalidated",
                    op, (void *)e, (unsigned long long)(*p)->cap->id);
  } else {
    st = capture_unsafe(op);
  }
  pthread_mutex_unlock(&cap_mu);
  return st;
}

gca_status_t gca__sim_capture_check_device(const char *op, int dev) {
  if (atomic_load(&ncaptures) == 0)
    return GCA_OK;
  gca_status_t st;
  pthread_mutex_lock(&cap_mu);
  if ((st = capture_unsafe(op)) != GCA_OK)
    goto out;
  for (capture_t *c = captures; c; c = c->next) {
    for (size_t i = 0; i < c->nstreams; i++) {
      if (c->streams[i].dev == dev) {
        c->invalidated = true;
        st = gca__error(GCA_ERR_CAPTURE_UNSUPPORTED,
                        "%s: stream %p of device %d is capturing (capture %llu, now invalidated)",
                        op, (void *)c->streams[i].s, dev, (unsigned long long)c->id);
        break;
      }
    }
  }
out:
  pthread_mutex_unlock(&cap_mu);
  return st;
}

gca_status_t gca__sim_capture_submit(const char *op, gca_stream_t s, int dev, bool legacy,
                                     const gca__sim_work_t *w, bool *captured) {
  *captured = false;
  if (atomic_load(&ncaptures) == 0)
    return GCA_OK;
  gca_status_t st = GCA_OK;
  capture_t *c = NULL;
  pthread_mutex_lock(&cap_mu);
  if (legacy) {
    if (legacy_conflict(dev, &c))
      st = implicit_error(op, dev, c);
    goto out;
  }
  cap_stream_t *cs = find_stream(s, &c);
  if (!cs)
    goto out;
  *captured = true;
  if (c->invalidated) {
    st = invalidated_error(op, c);
    goto out;
  }
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    node_t *nodes = realloc(c->nodes, cap * sizeof(*nodes));
    if (!nodes)
      goto oom;
    c->nodes = nodes;
    c->cap = cap;
  }
  node_t *nd = &c->nodes[c->n];
  idxs_t tail = {0};
  if (!idxs_add(&tail, c->n))
    goto oom;
  nd->deps = NULL;
  nd->ndeps = cs->tail.n;
  if (nd->ndeps > 0) {
    nd->deps = malloc(nd->ndeps * sizeof(*nd->deps));
    if (!nd->deps) {
      idxs_free(&tail);
      goto oom;
    }
    memcpy(nd->deps, cs->tail.v, nd->ndeps * sizeof(*nd->deps));
    qsort(nd->deps, nd->ndeps, sizeof(*nd->deps), cmp_size);
  }
  nd->work = *w;
  gca__sim_work_hold(&nd->work);
  idxs_free(&cs->tail);
  cs->tail = tail;
  c->n++;
  goto out;
oom:
  st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a graph node", op);
out:
  pthread_mutex_unlock(&cap_mu);
  return st;
}

gca_status_t gca__sim_capture_record(const char *op, gca_event_t e, gca_stream_t s, int dev,
                                     bool legacy, bool *captured) {
  *captured = false;
  if (capture_state_empty())
    return GCA_OK;
  gca_status_t st = GCA_OK;
  capture_t *c = NULL;
  pthread_mutex_lock(&cap_mu);
  cap_event_t **p = find_event(e);
  if (legacy && legacy_conflict(dev, &c)) {
    st = implicit_error(op, dev, c);
    goto out;
  }
  cap_stream_t *cs = find_stream(s, &c);
  if (!cs) {
    if (p)
      event_drop(p);
    goto out;
  }
  *captured = true;
  if (c->invalidated) {
    st = invalidated_error(op, c);
    goto out;
  }
  cap_event_t *ce = p ? *p : calloc(1, sizeof(*ce));
  idxs_t nodes = {0};
  if (!ce || !idxs_union(&nodes, &cs->tail)) {
    if (!p)
      free(ce);
    idxs_free(&nodes);
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to record event %p", op, (void *)e);
    goto out;
  }
  if (!p) {
    ce->e = e;
    ce->next = cap_events;
    cap_events = ce;
  } else if (!ce->cap) {
    atomic_fetch_sub(&norphans, 1);
  }
  idxs_free(&ce->nodes);
  ce->nodes = nodes;
  ce->cap = c;
out:
  pthread_mutex_unlock(&cap_mu);
  return st;
}

gca_status_t gca__sim_capture_wait(const char *op, gca_stream_t s, int dev, bool blocking,
                                   bool legacy, gca_event_t e, bool event_recorded,
                                   bool *captured) {
  *captured = false;
  if (capture_state_empty())
    return GCA_OK;
  gca_status_t st = GCA_OK;
  capture_t *c = NULL, *lc;
  pthread_mutex_lock(&cap_mu);
  if (legacy && legacy_conflict(dev, &lc)) {
    st = implicit_error(op, dev, lc);
    goto out;
  }
  cap_event_t **p = find_event(e);
  cap_stream_t *cs = find_stream(s, &c);
  if (p && !(*p)->cap) { /* Note [Captured events] */
    st = orphan_error(op, e);
  } else if (p) {
    cap_event_t *ce = *p;
    *captured = true;
    if (cs && c != ce->cap) {
      c->invalidated = ce->cap->invalidated = true;
      st = gca__error(GCA_ERR_DRIVER,
                      "%s: stream %p (capture %llu) waiting on event %p of capture %llu would "
                      "merge two capture sequences (CUDA_ERROR_STREAM_CAPTURE_MERGE)",
                      op, (void *)s, (unsigned long long)c->id, (void *)e,
                      (unsigned long long)ce->cap->id);
    } else if (ce->cap->invalidated) {
      st = invalidated_error(op, ce->cap);
    } else if (cs) {
      if (!idxs_union(&cs->tail, &ce->nodes))
        st =
            gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to join event %p", op, (void *)e);
    } else if (legacy) {
      ce->cap->invalidated = true;
      st = gca__error(GCA_ERR_CAPTURE_IMPLICIT,
                      "%s: the legacy stream cannot join capture %llu (event %p)", op,
                      (unsigned long long)ce->cap->id, (void *)e);
    } else {
      c = ce->cap;
      if (c->nstreams == c->capstreams) {
        size_t cap = c->capstreams * 2;
        cap_stream_t *v = realloc(c->streams, cap * sizeof(*v));
        if (!v) {
          st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to join stream %p", op,
                          (void *)s);
          goto out;
        }
        c->streams = v;
        c->capstreams = cap;
      }
      cap_stream_t *ns = &c->streams[c->nstreams];
      *ns = (cap_stream_t){.s = s, .dev = dev, .blocking = blocking};
      if (!idxs_union(&ns->tail, &ce->nodes)) {
        idxs_free(&ns->tail);
        st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to join stream %p", op,
                        (void *)s);
        goto out;
      }
      c->nstreams++;
    }
  } else if (cs) {
    *captured = true;
    if (c->invalidated) {
      st = invalidated_error(op, c);
    } else if (event_recorded) {
      c->invalidated = true;
      st = gca__error(GCA_ERR_DRIVER,
                      "%s: capturing stream %p waits on event %p recorded outside the capture "
                      "(CUDA_ERROR_STREAM_CAPTURE_ISOLATION); capture %llu is invalidated",
                      op, (void *)s, (void *)e, (unsigned long long)c->id);
    }
  }
out:
  pthread_mutex_unlock(&cap_mu);
  return st;
}

void gca__sim_capture_forget_stream(gca_stream_t s) {
  if (atomic_load(&ncaptures) == 0)
    return;
  capture_t *c = NULL;
  pthread_mutex_lock(&cap_mu);
  cap_stream_t *cs = find_stream(s, &c);
  if (cs && cs == &c->streams[0]) {
    capture_remove(c);
  } else if (cs) {
    c->invalidated = true;
    idxs_free(&cs->tail);
    *cs = c->streams[--c->nstreams];
  }
  pthread_mutex_unlock(&cap_mu);
}

void gca__sim_capture_forget_event(gca_event_t e) {
  if (capture_state_empty())
    return;
  pthread_mutex_lock(&cap_mu);
  cap_event_t **p = find_event(e);
  if (p)
    event_drop(p);
  pthread_mutex_unlock(&cap_mu);
}

/* ---- capture ops ---- */

static gca_status_t sim_stream_begin_capture(gca_stream_t stream, gca_capture_mode_t mode) {
  GCA_SIM_ENTER(stream_begin_capture, 0);
  GCA_CHECK(gca__sim_stream_canon("stream_begin_capture", &stream));
  int dev;
  bool blocking, legacy;
  gca_status_t st = GCA_OK;
  if ((unsigned)mode > GCA_CAPTURE_MODE_RELAXED)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_begin_capture: unknown capture mode %d",
                      (int)mode);
  GCA_CHECK(gca__sim_stream_describe("stream_begin_capture", stream, &dev, &blocking, &legacy));
  if (legacy)
    return gca__error(GCA_ERR_CAPTURE_UNSUPPORTED,
                      "stream_begin_capture: the legacy stream (NULL) cannot be captured");
  capture_t *c = calloc(1, sizeof(*c));
  cap_stream_t *v = calloc(4, sizeof(*v));
  if (!c || !v) {
    free(c);
    free(v);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "stream_begin_capture: no host memory for a capture");
  }
  gca__capture_enter(); /* Note [Capture gate]: before cap_mu, which the gate's calls take */
  pthread_mutex_lock(&cap_mu);
  capture_t *other;
  if (find_stream(stream, &other)) {
    st = gca__error(GCA_ERR_DRIVER,
                    "stream_begin_capture: stream %p already takes part in capture %llu "
                    "(CUDA_ERROR_ILLEGAL_STATE)",
                    (void *)stream, (unsigned long long)other->id);
    free(c);
    free(v);
    goto out;
  }
  c->id = atomic_fetch_add(&last_capture_id, 1) + 1;
  c->mode = mode;
  c->thread = pthread_self();
  c->streams = v;
  c->capstreams = 4;
  c->nstreams = 1;
  v[0] = (cap_stream_t){.s = stream, .dev = dev, .blocking = blocking};
  c->next = captures;
  captures = c;
  atomic_fetch_add(&ncaptures, 1);
out:
  pthread_mutex_unlock(&cap_mu);
  if (st != GCA_OK)
    gca__capture_abandon();
  return st;
}

/* True when every stream's tail lies in the ancestry of the origin's tail. */
static bool capture_joined(const capture_t *c, size_t *unjoined) {
  bool *reach = calloc(c->n ? c->n : 1, sizeof(*reach));
  size_t *stack = malloc((c->n ? c->n : 1) * sizeof(*stack));
  bool ok = true;
  if (!reach || !stack) {
    free(reach);
    free(stack);
    return true; /* no memory to prove it: let the graph through rather than lose it */
  }
  size_t top = 0;
  for (size_t k = 0; k < c->streams[0].tail.n; k++) {
    size_t i = c->streams[0].tail.v[k];
    if (!reach[i]) {
      reach[i] = true;
      stack[top++] = i;
    }
  }
  while (top > 0) {
    const node_t *nd = &c->nodes[stack[--top]];
    for (size_t k = 0; k < nd->ndeps; k++)
      if (!reach[nd->deps[k]]) {
        reach[nd->deps[k]] = true;
        stack[top++] = nd->deps[k];
      }
  }
  for (size_t j = 1; j < c->nstreams && ok; j++)
    for (size_t k = 0; k < c->streams[j].tail.n && ok; k++)
      if (!reach[c->streams[j].tail.v[k]]) {
        ok = false;
        *unjoined = j;
      }
  free(reach);
  free(stack);
  return ok;
}
bool gca__sim_capture_has_stream(gca_stream_t s) {
  if (atomic_load(&ncaptures) == 0)
    return false;
  capture_t *c = NULL;
  pthread_mutex_lock(&cap_mu);
  bool found = find_stream(s, &c) != NULL;
  pthread_mutex_unlock(&cap_mu);
  return found;
}

static gca_status_t sim_stream_end_capture(gca_stream_t stream, gca_graph_t *graph) {
  GCA_SIM_ENTER(stream_end_capture, 0);
  GCA_CHECK(gca__sim_stream_canon("stream_end_capture", &stream));
  int dev;
  bool blocking, legacy;
  gca_status_t st = GCA_OK;
  if (!graph)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_end_capture: graph is NULL");
  GCA_CHECK(gca__sim_stream_describe("stream_end_capture", stream, &dev, &blocking, &legacy));
  *graph = NULL;
  capture_t *c = NULL;
  size_t j;
  pthread_mutex_lock(&cap_mu);
  cap_stream_t *cs = find_stream(stream, &c);
  if (!cs) {
    st = gca__error(GCA_ERR_CAPTURE_UNMATCHED, "stream_end_capture: stream %p is not capturing",
                    (void *)stream);
  } else if (cs != &c->streams[0]) {
    c->invalidated = true;
    st = gca__error(GCA_ERR_CAPTURE_UNMATCHED,
                    "stream_end_capture: stream %p joined capture %llu, which was begun on stream "
                    "%p; the capture is invalidated",
                    (void *)stream, (unsigned long long)c->id, (void *)c->streams[0].s);
  } else if (c->mode != GCA_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
    c->invalidated = true;
    st = gca__error(GCA_ERR_CAPTURE_WRONG_THREAD,
                    "stream_end_capture: capture %llu on stream %p was begun in %s mode by "
                    "another thread; the capture is invalidated",
                    (unsigned long long)c->id, (void *)stream, mode_name(c->mode));
  } else if (c->invalidated) {
    st = invalidated_error("stream_end_capture", c);
    capture_remove(c);
  } else if (!capture_joined(c, &j)) {
    st = gca__error(GCA_ERR_CAPTURE_UNJOINED,
                    "stream_end_capture: stream %p forked from capture %llu has work not joined "
                    "back into origin stream %p",
                    (void *)c->streams[j].s, (unsigned long long)c->id, (void *)stream);
    capture_remove(c);
  } else {
    node_t *nodes = c->nodes;
    size_t n = c->n;
    c->nodes = NULL;
    c->n = 0;
    capture_remove(c);
    st = gca__sim_graph_adopt("stream_end_capture", nodes, n, graph);
  }
  pthread_mutex_unlock(&cap_mu);
  return st;
}

static gca_status_t sim_stream_capture_info(gca_stream_t stream, gca_capture_status_t *status,
                                            uint64_t *id) {
  GCA_SIM_ENTER(stream_capture_info, 0);
  GCA_CHECK(gca__sim_stream_canon("stream_capture_info", &stream));
  int dev;
  bool blocking, legacy;
  gca_status_t st = GCA_OK;
  if (!status)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_capture_info: status is NULL");
  GCA_CHECK(gca__sim_stream_describe("stream_capture_info", stream, &dev, &blocking, &legacy));
  *status = GCA_CAPTURE_STATUS_NONE;
  if (atomic_load(&ncaptures) == 0)
    return GCA_OK;
  capture_t *c = NULL;
  pthread_mutex_lock(&cap_mu);
  if (legacy) {
    /* cuStreamIsCapturing: IMPLICIT, but "the blocking stream capture is not invalidated" */
    if (legacy_blocked(dev, false, &c))
      st = gca__error(GCA_ERR_CAPTURE_IMPLICIT,
                      "stream_capture_info: the legacy stream of device %d is unusable while its "
                      "blocking stream %p captures (capture %llu)",
                      dev, (void *)c->streams[0].s, (unsigned long long)c->id);
  } else if (find_stream(stream, &c)) {
    *status = c->invalidated ? GCA_CAPTURE_STATUS_INVALIDATED : GCA_CAPTURE_STATUS_ACTIVE;
    if (id)
      *id = c->id;
  }
  pthread_mutex_unlock(&cap_mu);
  return st;
}

static gca_status_t sim_thread_exchange_capture_mode(gca_capture_mode_t *mode) {
  GCA_SIM_ENTER(thread_exchange_capture_mode, 0);
  if (!mode)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "thread_exchange_capture_mode: mode is NULL");
  if ((unsigned)*mode > GCA_CAPTURE_MODE_RELAXED)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "thread_exchange_capture_mode: unknown capture mode %d", (int)*mode);
  gca_capture_mode_t old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return GCA_OK;
}

void gca__sim_capture_ops(gca_device_ops_t *ops) {
  ops->stream_begin_capture = sim_stream_begin_capture;
  ops->stream_end_capture = sim_stream_end_capture;
  ops->stream_capture_info = sim_stream_capture_info;
  ops->thread_exchange_capture_mode = sim_thread_exchange_capture_mode;
}
