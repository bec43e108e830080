/* SPDX-License-Identifier: Apache-2.0 */
/* sim_stream.c - the sim's streams and events: a worker thread per stream runs
 * a FIFO of work items in order, asynchronously to the caller; events are
 * markers placed in that FIFO; host functions, copies, memsets and the
 * ready-made kernels are work items like any other (sim_work.c).
 *
 * The one idea: every ordering question reduces to "has stream S completed
 * its item number N?". A stream counts the items it was given (submitted) and
 * the items it has run (completed); a marker is (stream, N); event records,
 * stream waits, the legacy stream's implicit synchronization and graph-launch
 * ordering are all markers, waited for on the marked stream's condition
 * variable (no polling).
 *
 * Note [Legacy stream]: the NULL stream of a device is created lazily. Work
 * given to it first waits for all work already given to the device's blocking
 * streams; work given to a blocking stream first waits for all work already
 * given to the legacy stream. Non-blocking streams take no part.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_stream.h"
#include "lock.h"

/* ---- virtual time ----
 *
 * Note [Sim virtual time]: with GCA_SIM_CLOCK=virtual the sim keeps time
 * instead of measuring it, so that what a test times on streams is exact and
 * independent of the machine's load. Every stream has a clock (ns); an item
 * starts at the later of the stream's clock and the host's clock when the
 * item was given (a host thread cannot give work before the time it has
 * observed; each host thread has its own clock, so ranks on threads do not
 * delay each other through it); kernel_sleep(ns) advances the clock by ns without sleeping;
 * waiting for an event moves the clock to the event's time; an event's time
 * is its stream's clock where it was recorded, and event_elapsed reports the
 * difference of those times. A host thread's clock moves to what its
 * synchronizes (stream, event, device) observed; what threads tell each
 * other outside the device layer carries no time. Host functions may read and advance
 * their stream's clock (gca__sim_clock_now / _advance_to: the sim
 * collectives end at the latest rank's start plus their modelled cost).
 * Everything else takes no virtual time. A wait on a position rather than an
 * event (the legacy stream's implicit waits) moves the clock to the waited
 * stream's clock when the wait ends, which may be later than the position's
 * own time. The default (real) clock stamps events with CLOCK_MONOTONIC. */

static bool vclock;
static _Thread_local uint64_t host_vt; /* this host thread's clock */
static _Thread_local uint64_t *t_vt;   /* the clock of the item this worker runs */

void gca__sim_clock_set_virtual(bool on) {
  vclock = on;
}
bool gca__sim_clock_virtual(void) {
  return vclock;
}

uint64_t gca__sim_clock_now(void) {
  return t_vt ? *t_vt : host_vt;
}

uint64_t *gca__sim_clock_swap(uint64_t *clock) {
  uint64_t *old = t_vt;
  t_vt = clock;
  return old;
}

void gca__sim_clock_advance_to(uint64_t vt) {
  if (t_vt && vt > *t_vt)
    *t_vt = vt;
}

/* The calling host thread observed time vt (a synchronize). */
static void host_saw(uint64_t vt) {
  if (vt > host_vt)
    host_vt = vt;
}

/* ---- streams ---- */

typedef struct sim_stream sim_stream_t;

/* Complete iff stream->completed >= seq. time_ns is written by the stream's
 * worker (under its mutex) before the completion is published. */
struct gca__sim_marker {
  atomic_int refs;
  sim_stream_t *stream; /* holds a reference */
  uint64_t seq;
  uint64_t time_ns;
  uint64_t vt;  /* the stream's virtual clock there, once stamped (Note [Sim virtual time]) */
  bool stamped; /* by an ITEM_MARK: vt is the position's own time */
};

typedef enum item_kind { ITEM_WORK, ITEM_MARK, ITEM_WAIT } item_kind_t;

typedef struct item {
  struct item *next;
  item_kind_t kind;
  gca__sim_work_t work;      /* ITEM_WORK */
  gca__sim_marker_t *marker; /* ITEM_MARK: the marker to stamp; ITEM_WAIT: the one to wait for */
  uint64_t submit_vt;        /* the host's virtual clock when given (Note [Sim virtual time]) */
} item_t;

/* completed <= submitted; submitted - completed == items queued or running;
 * the worker holds a reference until it exits (dying and queue empty). */
struct sim_stream {
  gca__sim_obj_t obj;
  uint64_t handle; /* 0 for a legacy stream */
  int dev;
  unsigned flags;
  int priority;
  bool legacy;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;
  pthread_cond_t done_cv;
  item_t *head, *tail;
  uint64_t submitted, completed;
  int waiters;
  bool worker_idle;
  bool dying;
  gca__sim_fault_t fault; /* Note [Sim memory faults]: the first, under mu */
  uint64_t vt; /* virtual clock after the last item (Note [Sim virtual time]), under mu */
};

/* Per device: its streams (the legacy one apart), for Note [Legacy stream] and ctx_synchronize. */
static struct sim_dev_streams {
  pthread_mutex_t mu;
  sim_stream_t **v;
  size_t n, cap;
  sim_stream_t *legacy;
} devs[GCA_SIM_MAX_DEVICES];
static pthread_once_t devs_once = PTHREAD_ONCE_INIT;

static void devs_init(void) {
  for (int i = 0; i < GCA_SIM_MAX_DEVICES; i++)
    pthread_mutex_init(&devs[i].mu, NULL);
}

static void stream_free(gca__sim_obj_t *obj) {
  sim_stream_t *s = (sim_stream_t *)obj;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->done_cv);
  free(s);
}

static void stream_unref(sim_stream_t *s) {
  gca__sim_obj_unref(&s->obj);
}

static gca__sim_marker_t *marker_new(sim_stream_t *s, uint64_t seq) {
  gca__sim_marker_t *m = calloc(1, sizeof(*m));
  if (!m)
    return NULL;
  atomic_init(&m->refs, 1);
  gca__sim_obj_ref(&s->obj);
  m->stream = s;
  m->seq = seq;
  return m;
}

static void marker_ref(gca__sim_marker_t *m) {
  atomic_fetch_add(&m->refs, 1);
}

void gca__sim_marker_unref(gca__sim_marker_t *m) {
  if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
    stream_unref(m->stream);
    free(m);
  }
}

static bool marker_done(gca__sim_marker_t *m) {
  sim_stream_t *s = m->stream;
  pthread_mutex_lock(&s->mu);
  bool done = s->completed >= m->seq;
  pthread_mutex_unlock(&s->mu);
  return done;
}

/* Blocks until stream s has completed item `seq`. */
static void stream_wait_seq(sim_stream_t *s, uint64_t seq) {
  pthread_mutex_lock(&s->mu);
  s->waiters++;
  while (s->completed < seq)
    pthread_cond_wait(&s->done_cv, &s->mu);
  s->waiters--;
  pthread_mutex_unlock(&s->mu);
}

/* Waits for m; the later of vt and m's virtual time (Note [Sim virtual time]). */
static uint64_t wait_marker_vt(gca__sim_marker_t *m, uint64_t vt) {
  stream_wait_seq(m->stream, m->seq);
  if (!vclock)
    return vt;
  pthread_mutex_lock(&m->stream->mu);
  uint64_t mvt = m->stamped ? m->vt : m->stream->vt;
  pthread_mutex_unlock(&m->stream->mu);
  return mvt > vt ? mvt : vt;
}

static void item_free(item_t *it) {
  if (it->kind == ITEM_WORK)
    gca__sim_work_release(&it->work);
  else
    gca__sim_marker_unref(it->marker);
  free(it);
}

/* A destroyed stream stays listed until its worker has drained it, so that
 * ctx_synchronize and the legacy stream still wait for its pending work. */
static void dev_list_remove(sim_stream_t *s) {
  struct sim_dev_streams *d = &devs[s->dev];
  pthread_mutex_lock(&d->mu);
  for (size_t i = 0; i < d->n; i++) {
    if (d->v[i] == s) {
      d->v[i] = d->v[--d->n];
      break;
    }
  }
  pthread_mutex_unlock(&d->mu);
}

static void *stream_worker(void *arg) {
  sim_stream_t *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->dying) {
      s->worker_idle = true;
      pthread_cond_wait(&s->work_cv, &s->mu);
    }
    s->worker_idle = false;
    item_t *it = s->head;
    if (!it)
      break;
    s->head = it->next;
    if (!s->head)
      s->tail = NULL;
    uint64_t vt = s->vt > it->submit_vt ? s->vt : it->submit_vt;
    pthread_mutex_unlock(&s->mu);
    gca__sim_fault_t f = {0};
    t_vt = &vt;
    if (it->kind == ITEM_WORK)
      gca__sim_work_run(&it->work, &f);
    else if (it->kind == ITEM_WAIT)
      vt = wait_marker_vt(it->marker, vt);
    t_vt = NULL;
    pthread_mutex_lock(&s->mu);
    if (f.what && !s->fault.what)
      s->fault = f;
    s->vt = vt;
    if (it->kind == ITEM_MARK) {
      it->marker->vt = vt;
      it->marker->stamped = true;
      it->marker->time_ns = vclock ? vt : gca__now_ns();
    }
    s->completed++;
    if (s->waiters > 0)
      pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    item_free(it);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  if (!s->legacy)
    dev_list_remove(s);
  stream_unref(s);
  return NULL;
}

static gca_status_t stream_new(const char *op, int dev, unsigned flags, int priority, bool legacy,
                               sim_stream_t **out) {
  gca_status_t st;
  sim_stream_t *s = GCA_FAILPOINT("sim_stream_new") ? NULL : calloc(1, sizeof(*s));
  if (!s)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a stream", op);
  atomic_init(&s->obj.refs, 2); /* the creator's and the worker's */
  s->obj.kind = GCA__SIM_STREAM;
  s->obj.free_fn = stream_free;
  s->dev = dev;
  s->flags = flags;
  s->priority = priority;
  s->legacy = legacy;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, stream_worker, s);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: cannot start a stream worker thread: %s", op,
                    strerror(rc));
    goto fail_thread;
  }
  *out = s;
  return GCA_OK;
fail_thread:
  stream_free(&s->obj);
  return st;
}

/* The legacy stream of dev, created on first use; a reference is taken. */
static gca_status_t legacy_stream(const char *op, int dev, sim_stream_t **out) {
  pthread_once(&devs_once, devs_init);
  struct sim_dev_streams *d = &devs[dev];
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&d->mu);
  if (!d->legacy) {
    sim_stream_t *s;
    st = stream_new(op, dev, GCA_STREAM_DEFAULT, 0, true, &s);
    if (st == GCA_OK)
      d->legacy = s; /* the creator's reference stays with devs[] */
  }
  if (st == GCA_OK) {
    gca__sim_obj_ref(&d->legacy->obj);
    *out = d->legacy;
  }
  pthread_mutex_unlock(&d->mu);
  return st;
}

/* The calling thread's current device (ctx_set_device); 0 until set. */
static _Thread_local int t_current_dev;

/* The stream behind a handle (NULL: the current device's legacy stream), referenced. */
/* Note [Strict handles]: the driver's behaviour on a destroyed stream is
 * undefined (cuStreamGetCtx on one dies with SIGSEGV on an H200, driver 580).
 * The sim aborts with a message naming the call, so that nothing in gca (or
 * a program tested on the sim) comes to depend on an answer the driver does
 * not give (Note [Destroyed streams], allocator/streamkey.c).
 * GCA_SIM_STRICT_HANDLES=0 answers GCA_ERR_INVALID_HANDLE instead: the tests
 * of what gca says to such bad input set it. A handle that never named a
 * stream is always GCA_ERR_INVALID_HANDLE. */
static bool strict_handles(void) {
  static atomic_int strict = -1;
  int v = atomic_load_explicit(&strict, memory_order_relaxed);
  if (v < 0) {
    const char *e = getenv("GCA_SIM_STRICT_HANDLES");
    v = !(e != NULL && strcmp(e, "0") == 0);
    atomic_store_explicit(&strict, v, memory_order_relaxed);
  }
  return v != 0;
}

static gca_status_t stream_get(const char *op, gca_stream_t h, sim_stream_t **out) {
  if (!h)
    return legacy_stream(op, t_current_dev, out);
  gca__sim_obj_t *obj = gca__sim_handle_get(GCA__SIM_STREAM, (uint64_t)(uintptr_t)h);
  if (!obj) {
    if (strict_handles() && gca__sim_handle_was_live(GCA__SIM_STREAM, (uint64_t)(uintptr_t)h)) {
      fprintf(stderr,
              "gca: sim: %s: stream %p was destroyed; the driver's behaviour is undefined (it "
              "may crash), so the sim aborts (GCA_SIM_STRICT_HANDLES=0: an error instead)\n",
              op, (void *)h);
      abort();
    }
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: stream %p is not a live stream", op, (void *)h);
  }
  *out = (sim_stream_t *)obj;
  return GCA_OK;
}

static bool stream_pending(sim_stream_t *s, uint64_t *seq) {
  pthread_mutex_lock(&s->mu);
  *seq = s->submitted;
  bool pending = s->completed < s->submitted;
  pthread_mutex_unlock(&s->mu);
  return pending;
}

static item_t *wait_item(gca__sim_marker_t *m) {
  item_t *it = calloc(1, sizeof(*it));
  if (!it)
    return NULL;
  it->kind = ITEM_WAIT;
  it->marker = m;
  return it;
}

/* The implicit waits Note [Legacy stream] puts before new work on s, as a chain. */
static gca_status_t legacy_waits(const char *op, sim_stream_t *s, item_t **head, item_t **tail) {
  *head = *tail = NULL;
  if (!s->legacy && (s->flags & GCA_STREAM_NON_BLOCKING))
    return GCA_OK;
  pthread_once(&devs_once, devs_init);
  struct sim_dev_streams *d = &devs[s->dev];
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&d->mu);
  size_t nothers = s->legacy ? d->n : (d->legacy ? 1 : 0);
  for (size_t i = 0; i < nothers; i++) {
    sim_stream_t *o = s->legacy ? d->v[i] : d->legacy;
    uint64_t seq;
    if ((o->flags & GCA_STREAM_NON_BLOCKING) || !stream_pending(o, &seq))
      continue;
    gca__sim_marker_t *m = marker_new(o, seq);
    item_t *it = m ? wait_item(m) : NULL;
    if (!it) {
      gca__sim_marker_unref(m);
      st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a work item", op);
      break;
    }
    if (*tail)
      (*tail)->next = it;
    else
      *head = it;
    *tail = it;
  }
  pthread_mutex_unlock(&d->mu);
  if (st != GCA_OK) {
    while (*head) {
      item_t *next = (*head)->next;
      item_free(*head);
      *head = next;
    }
    *tail = NULL;
  }
  return st;
}

/* Appends the chain first..last, preceded by its implicit legacy waits, to s;
 * an ITEM_MARK's marker learns its position here. On failure the chain is freed. */
static gca_status_t stream_push(const char *op, sim_stream_t *s, item_t *first, item_t *last) {
  item_t *wh, *wt;
  gca_status_t st = legacy_waits(op, s, &wh, &wt);
  if (st != GCA_OK) {
    while (first) {
      item_t *next = first->next;
      item_free(first);
      first = next;
    }
    return st;
  }
  if (wt) {
    wt->next = first;
    first = wh;
  }
  uint64_t now = host_vt;
  pthread_mutex_lock(&s->mu);
  for (item_t *it = first; it; it = it->next) {
    it->submit_vt = now;
    s->submitted++;
    if (it->kind == ITEM_MARK)
      it->marker->seq = s->submitted;
  }
  if (s->tail)
    s->tail->next = first;
  else
    s->head = first;
  s->tail = last;
  if (s->worker_idle)
    pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return GCA_OK;
}

gca_status_t gca__sim_stream_describe(const char *op, gca_stream_t stream, int *dev, bool *blocking,
                                      bool *legacy) {
  sim_stream_t *s = NULL;
  GCA_CHECK(gca__sim_stream_canon(op, &stream));
  GCA_CHECK(stream_get(op, stream, &s));
  *dev = s->dev;
  *blocking = s->legacy || !(s->flags & GCA_STREAM_NON_BLOCKING);
  *legacy = s->legacy;
  stream_unref(s);
  return GCA_OK;
}

/* The stream's fault (Note [Sim memory faults]) as an error naming op, else GCA_OK. */
static gca_status_t stream_fault(const char *op, sim_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  gca__sim_fault_t f = s->fault;
  pthread_mutex_unlock(&s->mu);
  if (!f.what)
    return GCA_OK;
  return gca__error(GCA_ERR_ILLEGAL_ADDRESS,
                    "%s: CUDA_ERROR_ILLEGAL_ADDRESS: a %s on %s touched [0x%llx, +%zu), which is "
                    "not mapped device memory; the stream's work after it did not run as issued",
                    op, f.what, s->legacy ? "the legacy stream" : "a stream",
                    (unsigned long long)f.addr, f.len);
}

/* Note [Sim access rights]: the stream's device must have access to every
 * device range the work touches; one lookup per operand range. */
static gca_status_t work_access(const char *op, int dev, const gca__sim_work_t *w) {
  size_t words = w->count > SIZE_MAX / 4 ? SIZE_MAX : w->count * 4;
  switch (w->kind) {
  case GCA__SIM_WORK_MEMCPY:
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->dst, w->count, true));
    return gca__sim_mem_check_access(op, dev, w->a, w->count, true);
  case GCA__SIM_WORK_MEMSET8:
    return gca__sim_mem_check_access(op, dev, w->dst, w->count, false);
  case GCA__SIM_WORK_MEMSET32:
  case GCA__SIM_WORK_FILL:
    return gca__sim_mem_check_access(op, dev, w->dst, words, false);
  case GCA__SIM_WORK_ADD:
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->dst, words, false));
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->a, words, false));
    return gca__sim_mem_check_access(op, dev, w->b, words, false);
  case GCA__SIM_WORK_COPY_BATCH: /* the entries are read when it runs */
    return gca__sim_mem_check_access(op, dev, w->a, w->count * sizeof(gca_copy_entry_t), false);
  case GCA__SIM_WORK_PHILOX:
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->dst, words, false));
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->a, sizeof(uint64_t), false));
    return gca__sim_mem_check_access(op, dev, w->b, sizeof(uint64_t), false);
  case GCA__SIM_WORK_GEMM:
  case GCA__SIM_WORK_EW:
  case GCA__SIM_WORK_DOT: {
    gca__compute_span_t sp = gca__sim_compute_span(w);
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->dst, sp.dst, false));
    GCA_CHECK(gca__sim_mem_check_access(op, dev, w->a, sp.a, false));
    return gca__sim_mem_check_access(op, dev, w->b, sp.b, false);
  }
  default:
    return GCA_OK;
  }
}

/* How submit() treats a copy: `stage` reads the source into a buffer at the
 * call (pageable host memory, Note [Sim copies]); `sync` returns only once the
 * work has run (host-to-host). Neither applies while the stream captures. */
static gca_status_t submit(const char *op, gca_stream_t stream, const gca__sim_work_t *w,
                           bool *captured, bool stage, bool sync) {
  sim_stream_t *s = NULL;
  gca_status_t st;
  bool cap = false;
  GCA_CHECK(gca__sim_stream_canon(op, &stream));
  GCA_CHECK(stream_get(op, stream, &s));
  GCA_CHECK_GOTO(work_access(op, s->dev, w), st, out);
  GCA_CHECK_GOTO(gca__sim_capture_submit(op, stream, s->dev, s->legacy, w, &cap), st, out);
  if (!cap) {
    item_t *it = calloc(1, sizeof(*it));
    void *staged = !stage || w->count == 0             ? NULL
                   : GCA_FAILPOINT("sim_copy_staging") ? NULL
                                                       : malloc(w->count);
    if (!it || (stage && w->count > 0 && !staged)) {
      free(it);
      free(staged);
      st = it ? gca__error(GCA_ERR_OUT_OF_MEMORY,
                           "%s: no host memory to stage %zu bytes of pageable source", op,
                           (size_t)w->count)
              : gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a work item", op);
      goto out;
    }
    it->kind = ITEM_WORK;
    it->work = *w;
    if (staged) {
      memcpy(staged, (const void *)(uintptr_t)w->a, w->count);
      it->work.staged = staged;
    }
    gca__sim_work_hold(&it->work);
    GCA_CHECK_GOTO(stream_push(op, s, it, it), st, out);
    if (sync) {
      uint64_t seq;
      stream_pending(s, &seq);
      stream_wait_seq(s, seq);
      st = stream_fault(op, s);
    }
  }
out:
  if (captured)
    *captured = cap;
  stream_unref(s);
  return st;
}

gca_status_t gca__sim_stream_submit(const char *op, gca_stream_t stream, const gca__sim_work_t *w,
                                    bool *captured) {
  return submit(op, stream, w, captured, false, false);
}

gca_status_t gca__sim_stream_submit_copy(const char *op, gca_stream_t stream,
                                         const gca__sim_work_t *w, bool stage, bool sync) {
  return submit(op, stream, w, NULL, stage, sync);
}

/* Places a stamped marker at the end of s; the caller owns one reference. */
static gca_status_t stream_mark(const char *op, sim_stream_t *s, gca__sim_marker_t **out) {
  gca__sim_marker_t *m = marker_new(s, 0);
  item_t *it = calloc(1, sizeof(*it));
  if (!m || !it) {
    free(it);
    gca__sim_marker_unref(m);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a work item", op);
  }
  it->kind = ITEM_MARK;
  it->marker = m;
  marker_ref(m);
  GCA_CHECK(stream_push(op, s, it, it));
  *out = m;
  return GCA_OK;
}

gca__sim_marker_t *gca__sim_stream_mark(gca_stream_t stream) {
  sim_stream_t *s = NULL;
  gca__sim_marker_t *m = NULL;
  if (gca__sim_stream_canon("graph_launch", &stream) != GCA_OK ||
      stream_get("graph_launch", stream, &s) != GCA_OK)
    return NULL;
  if (stream_mark("graph_launch", s, &m) != GCA_OK)
    m = NULL;
  stream_unref(s);
  return m;
}

static gca_status_t stream_wait_marker(const char *op, sim_stream_t *s, gca__sim_marker_t *m) {
  item_t *it = wait_item(m);
  if (!it)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a work item", op);
  marker_ref(m);
  return stream_push(op, s, it, it);
}

gca_status_t gca__sim_stream_wait_marker(const char *op, gca_stream_t stream,
                                         gca__sim_marker_t *m) {
  sim_stream_t *s = NULL;
  GCA_CHECK(gca__sim_stream_canon(op, &stream));
  GCA_CHECK(stream_get(op, stream, &s));
  gca_status_t st = stream_wait_marker(op, s, m);
  stream_unref(s);
  return st;
}

/* ---- stream ops ---- */

/* A registered stream listed on its device; *out holds the creator's reference. */
static gca_status_t stream_create_listed(const char *op, int dev, unsigned flags, int priority,
                                         sim_stream_t **out) {
  gca_status_t st;
  sim_stream_t *s = NULL;
  GCA_CHECK(stream_new(op, dev, flags, priority, false, &s));
  struct sim_dev_streams *d = &devs[dev];
  pthread_once(&devs_once, devs_init);
  pthread_mutex_lock(&d->mu);
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 16;
    sim_stream_t **v = realloc(d->v, cap * sizeof(*v));
    if (!v) {
      pthread_mutex_unlock(&d->mu);
      st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for the stream list", op);
      goto fail_list;
    }
    d->v = v;
    d->cap = cap;
  }
  d->v[d->n++] = s;
  pthread_mutex_unlock(&d->mu);
  s->handle = gca__sim_handle_add(&s->obj);
  if (!s->handle) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: the handle registry is full", op);
    goto fail_handle;
  }
  *out = s;
  return GCA_OK;
fail_handle:
fail_list:
  pthread_mutex_lock(&s->mu);
  s->dying = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  stream_unref(s);
  return st;
}

static gca_status_t sim_stream_create(int dev, unsigned flags, int priority, gca_stream_t *out) {
  GCA_SIM_ENTER(stream_create, 0);
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_create: out is NULL");
  GCA_CHECK(gca__sim_check_device("stream_create", dev));
  if (flags & ~GCA_STREAM_NON_BLOCKING)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_create: unknown flags 0x%x", flags);
  /* The driver clamps priorities to its range [-5, 0] (greatest = -5). */
  priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
  sim_stream_t *s = NULL;
  GCA_CHECK(stream_create_listed("stream_create", dev, flags, priority, &s));
  *out = (gca_stream_t)(uintptr_t)s->handle;
  return GCA_OK;
}

/* Unregisters s (handle h) and lets its worker drain and exit; takes the caller's reference. */
static gca_status_t stream_retire(const char *op, sim_stream_t *s, gca_stream_t h) {
  if (!gca__sim_handle_remove(GCA__SIM_STREAM, s->handle)) {
    stream_unref(s);
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: stream %p is not a live stream", op, (void *)h);
  }
  gca__sim_capture_forget_stream(h);
  pthread_mutex_lock(&s->mu);
  s->dying = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  stream_unref(s); /* the registry's */
  stream_unref(s); /* ours */
  return GCA_OK;
}

/* Note [Special streams] (device.h): per thread and device, the stream behind
 * GCA_STREAM_PER_THREAD, an ordinary blocking stream created on first use and
 * retired when the thread exits (its queued work still runs). */
static _Thread_local sim_stream_t *t_per_thread[GCA_SIM_MAX_DEVICES];
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;

static void per_thread_exit(void *unused) {
  (void)unused;
  for (int dev = 0; dev < GCA_SIM_MAX_DEVICES; dev++) {
    sim_stream_t *s = t_per_thread[dev];
    t_per_thread[dev] = NULL;
    if (s) {
      gca__sim_obj_ref(&s->obj); /* stream_retire takes a caller's reference */
      (void)stream_retire("stream_destroy", s, (gca_stream_t)(uintptr_t)s->handle);
    }
  }
}

static void per_thread_key_init(void) {
  (void)pthread_key_create(&per_thread_key, per_thread_exit);
}

gca_status_t gca__sim_stream_canon(const char *op, gca_stream_t *h) {
  if (*h == GCA_STREAM_LEGACY) {
    *h = NULL;
    return GCA_OK;
  }
  if (*h != GCA_STREAM_PER_THREAD)
    return GCA_OK;
  int dev = t_current_dev;
  if (!t_per_thread[dev]) {
    pthread_once(&per_thread_once, per_thread_key_init);
    sim_stream_t *s = NULL;
    GCA_CHECK(stream_create_listed(op, dev, GCA_STREAM_DEFAULT, 0, &s));
    t_per_thread[dev] = s;
    (void)pthread_setspecific(per_thread_key, (void *)1);
  }
  *h = (gca_stream_t)(uintptr_t)t_per_thread[dev]->handle;
  return GCA_OK;
}

static gca_status_t sim_stream_destroy(gca_stream_t stream) {
  GCA_SIM_ENTER(stream_destroy, 0);
  if (!stream || GCA_STREAM_IS_SPECIAL(stream))
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "stream_destroy: the %s stream (%p) cannot be destroyed",
                      stream == GCA_STREAM_PER_THREAD ? "per-thread" : "legacy", (void *)stream);
  sim_stream_t *s = NULL;
  GCA_CHECK(stream_get("stream_destroy", stream, &s));
  return stream_retire("stream_destroy", s, stream);
}

/* Waits for the work given to s so far; for the legacy stream also for the
 * work of the blocking streams it covers (Note [Legacy stream]). */
static gca_status_t stream_drain(const char *op, sim_stream_t *s) {
  uint64_t seq;
  stream_pending(s, &seq);
  stream_wait_seq(s, seq);
  if (!s->legacy)
    return GCA_OK;
  item_t *head, *tail;
  GCA_CHECK(legacy_waits(op, s, &head, &tail));
  while (head) {
    item_t *next = head->next;
    stream_wait_seq(head->marker->stream, head->marker->seq);
    item_free(head);
    head = next;
  }
  return GCA_OK;
}

static gca_status_t sim_stream_synchronize(gca_stream_t stream) {
  GCA_SIM_ENTER(stream_synchronize, 0);
  gca__assert_no_lock("stream_synchronize");
  GCA_CHECK(gca__sim_stream_canon("stream_synchronize", &stream));
  sim_stream_t *s = NULL;
  gca_status_t st;
  GCA_CHECK(stream_get("stream_synchronize", stream, &s));
  GCA_CHECK_GOTO(gca__sim_capture_check_stream("stream_synchronize", stream, s->dev, s->legacy), st,
                 out);
  GCA_CHECK_GOTO(stream_drain("stream_synchronize", s), st, out);
  pthread_mutex_lock(&s->mu);
  host_saw(s->vt);
  pthread_mutex_unlock(&s->mu);
  st = stream_fault("stream_synchronize", s);
out:
  stream_unref(s);
  return st;
}

/* With the legacy stream also checks the blocking streams it implicitly covers. */
static bool stream_idle(sim_stream_t *s) {
  uint64_t seq;
  if (stream_pending(s, &seq))
    return false;
  if (!s->legacy)
    return true;
  struct sim_dev_streams *d = &devs[s->dev];
  bool idle = true;
  pthread_mutex_lock(&d->mu);
  for (size_t i = 0; i < d->n && idle; i++)
    if (!(d->v[i]->flags & GCA_STREAM_NON_BLOCKING) && stream_pending(d->v[i], &seq))
      idle = false;
  pthread_mutex_unlock(&d->mu);
  return idle;
}

static gca_status_t sim_stream_query(gca_stream_t stream) {
  GCA_SIM_ENTER(stream_query, 0);
  GCA_CHECK(gca__sim_stream_canon("stream_query", &stream));
  sim_stream_t *s = NULL;
  gca_status_t st;
  GCA_CHECK(stream_get("stream_query", stream, &s));
  GCA_CHECK_GOTO(gca__sim_capture_check_stream("stream_query", stream, s->dev, s->legacy), st, out);
  if (!stream_idle(s))
    st = gca__error(GCA_ERR_NOT_READY, "stream_query: stream %p has pending work", (void *)stream);
  else
    st = stream_fault("stream_query", s);
out:
  stream_unref(s);
  return st;
}

static gca_status_t sim_ctx_set_device(int dev) {
  GCA_SIM_ENTER(ctx_set_device, 0);
  GCA_CHECK(gca__sim_check_device("ctx_set_device", dev));
  t_current_dev = dev;
  return GCA_OK;
}

static gca_status_t sim_ctx_get_device(int *dev) {
  GCA_SIM_ENTER(ctx_get_device, 0);
  if (!dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ctx_get_device: dev is NULL");
  *dev = t_current_dev;
  return GCA_OK;
}

static gca_status_t sim_stream_get_device(gca_stream_t stream, int *dev) {
  GCA_SIM_ENTER(stream_get_device, 0);
  if (!dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "stream_get_device: dev is NULL");
  GCA_CHECK(gca__sim_stream_canon("stream_get_device", &stream));
  sim_stream_t *s = NULL;
  GCA_CHECK(stream_get("stream_get_device", stream, &s));
  *dev = s->dev;
  stream_unref(s);
  return GCA_OK;
}

/* The first fault kept by a live stream of dev (Note [Sim memory faults]). */
static gca_status_t device_fault(int dev) {
  struct sim_dev_streams *d = &devs[dev];
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&d->mu);
  for (size_t i = 0; i <= d->n && st == GCA_OK; i++) {
    sim_stream_t *s = i < d->n ? d->v[i] : d->legacy;
    if (!s)
      continue;
    pthread_mutex_lock(&s->mu);
    bool live = !s->dying; /* a destroyed stream's fault went with it */
    pthread_mutex_unlock(&s->mu);
    if (live)
      st = stream_fault("ctx_synchronize", s);
  }
  pthread_mutex_unlock(&d->mu);
  return st;
}

static gca_status_t sim_ctx_synchronize(int dev) {
  GCA_SIM_ENTER(ctx_synchronize, 0);
  gca__assert_no_lock("ctx_synchronize");
  GCA_CHECK(gca__sim_check_device("ctx_synchronize", dev));
  GCA_CHECK(gca__sim_capture_check_device("ctx_synchronize", dev));
  gca__sim_device_drain(dev);
  return device_fault(dev);
}

/* The host observed every stream of d drained. */
static void device_saw(struct sim_dev_streams *d) {
  pthread_mutex_lock(&d->mu);
  for (size_t i = 0; i <= d->n; i++) {
    sim_stream_t *s = i < d->n ? d->v[i] : d->legacy;
    if (!s)
      continue;
    pthread_mutex_lock(&s->mu);
    host_saw(s->vt);
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_unlock(&d->mu);
}

void gca__sim_device_drain(int dev) {
  pthread_once(&devs_once, devs_init);
  struct sim_dev_streams *d = &devs[dev];
  for (;;) {
    sim_stream_t *busy = NULL;
    uint64_t seq = 0;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i <= d->n && !busy; i++) {
      sim_stream_t *s = i < d->n ? d->v[i] : d->legacy;
      if (s && stream_pending(s, &seq)) {
        busy = s;
        gca__sim_obj_ref(&s->obj);
      }
    }
    pthread_mutex_unlock(&d->mu);
    if (!busy) {
      device_saw(d);
      return;
    }
    stream_wait_seq(busy, seq);
    stream_unref(busy);
  }
}

/* ---- events ---- */

/* last: the marker of the latest record outside capture, NULL before the first. */
typedef struct sim_event {
  gca__sim_obj_t obj;
  uint64_t handle;
  int dev;
  unsigned flags;
  pthread_mutex_t mu;
  gca__sim_marker_t *last;
} sim_event_t;

static void event_free(gca__sim_obj_t *obj) {
  sim_event_t *e = (sim_event_t *)obj;
  gca__sim_marker_unref(e->last);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

static gca_status_t event_get(const char *op, gca_event_t h, sim_event_t **out) {
  if (!h)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: event is NULL", op);
  gca__sim_obj_t *obj = gca__sim_handle_get(GCA__SIM_EVENT, (uint64_t)(uintptr_t)h);
  if (!obj)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: event %p is not a live event", op, (void *)h);
  *out = (sim_event_t *)obj;
  return GCA_OK;
}

/* The event's latest marker, referenced, or NULL when never recorded. */
static gca__sim_marker_t *event_marker(sim_event_t *e) {
  pthread_mutex_lock(&e->mu);
  gca__sim_marker_t *m = e->last;
  if (m)
    marker_ref(m);
  pthread_mutex_unlock(&e->mu);
  return m;
}

static gca_status_t sim_event_create(int dev, unsigned flags, gca_event_t *out) {
  GCA_SIM_ENTER(event_create, 0);
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "event_create: out is NULL");
  GCA_CHECK(gca__sim_check_device("event_create", dev));
  if (flags & ~(GCA_EVENT_BLOCKING_SYNC | GCA_EVENT_DISABLE_TIMING))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "event_create: unknown flags 0x%x", flags);
  sim_event_t *e = calloc(1, sizeof(*e));
  if (!e)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "event_create: no host memory for an event");
  atomic_init(&e->obj.refs, 1);
  e->obj.kind = GCA__SIM_EVENT;
  e->obj.free_fn = event_free;
  e->dev = dev;
  e->flags = flags;
  pthread_mutex_init(&e->mu, NULL);
  e->handle = gca__sim_handle_add(&e->obj);
  if (!e->handle) {
    event_free(&e->obj);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "event_create: the handle registry is full");
  }
  *out = (gca_event_t)(uintptr_t)e->handle;
  return GCA_OK;
}

static gca_status_t sim_event_destroy(gca_event_t event) {
  GCA_SIM_ENTER(event_destroy, 0);
  sim_event_t *e = NULL;
  GCA_CHECK(event_get("event_destroy", event, &e));
  if (!gca__sim_handle_remove(GCA__SIM_EVENT, e->handle)) {
    gca__sim_obj_unref(&e->obj);
    return gca__error(GCA_ERR_INVALID_HANDLE, "event_destroy: event %p is not a live event",
                      (void *)event);
  }
  gca__sim_capture_forget_event(event);
  gca__sim_obj_unref(&e->obj);
  gca__sim_obj_unref(&e->obj);
  return GCA_OK;
}

static gca_status_t sim_event_record(gca_event_t event, gca_stream_t stream) {
  GCA_SIM_ENTER(event_record, 0);
  GCA_CHECK(gca__sim_stream_canon("event_record", &stream));
  sim_event_t *e = NULL;
  sim_stream_t *s = NULL;
  gca_status_t st;
  bool captured = false;
  GCA_CHECK(event_get("event_record", event, &e));
  GCA_CHECK_GOTO(stream_get("event_record", stream, &s), st, fail_stream);
  if (s->dev != e->dev) {
    st = gca__error(GCA_ERR_INVALID_HANDLE,
                    "event_record: event %p is on device %d, stream %p on device %d", (void *)event,
                    e->dev, (void *)stream, s->dev);
    goto out;
  }
  GCA_CHECK_GOTO(
      gca__sim_capture_record("event_record", event, stream, s->dev, s->legacy, &captured), st,
      out);
  if (!captured) {
    gca__sim_marker_t *m;
    GCA_CHECK_GOTO(stream_mark("event_record", s, &m), st, out);
    pthread_mutex_lock(&e->mu);
    gca__sim_marker_t *old = e->last;
    e->last = m;
    pthread_mutex_unlock(&e->mu);
    gca__sim_marker_unref(old);
  }
out:
  stream_unref(s);
fail_stream:
  gca__sim_obj_unref(&e->obj);
  return st;
}

static gca_status_t sim_event_query(gca_event_t event) {
  GCA_SIM_ENTER(event_query, 0);
  sim_event_t *e = NULL;
  gca_status_t st;
  GCA_CHECK(event_get("event_query", event, &e));
  GCA_CHECK_GOTO(gca__sim_capture_check_event("event_query", event), st, out);
  gca__sim_marker_t *m = event_marker(e);
  if (m && !marker_done(m))
    st = gca__error(GCA_ERR_NOT_READY, "event_query: the work recorded in event %p is pending",
                    (void *)event);
  else if (m)
    st = stream_fault("event_query", m->stream);
  gca__sim_marker_unref(m);
out:
  gca__sim_obj_unref(&e->obj);
  return st;
}

static gca_status_t sim_event_synchronize(gca_event_t event) {
  GCA_SIM_ENTER(event_synchronize, 0);
  gca__assert_no_lock("event_synchronize");
  sim_event_t *e = NULL;
  gca_status_t st;
  GCA_CHECK(event_get("event_synchronize", event, &e));
  GCA_CHECK_GOTO(gca__sim_capture_check_event("event_synchronize", event), st, out);
  gca__sim_marker_t *m = event_marker(e);
  if (m) {
    host_saw(wait_marker_vt(m, 0));
    st = stream_fault("event_synchronize", m->stream);
  }
  gca__sim_marker_unref(m);
out:
  gca__sim_obj_unref(&e->obj);
  return st;
}

static gca_status_t sim_event_elapsed(gca_event_t start, gca_event_t end, float *ms) {
  GCA_SIM_ENTER(event_elapsed, 0);
  sim_event_t *a = NULL, *b = NULL;
  gca_status_t st = GCA_OK;
  if (!ms)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "event_elapsed: ms is NULL");
  GCA_CHECK(event_get("event_elapsed", start, &a));
  GCA_CHECK_GOTO(event_get("event_elapsed", end, &b), st, fail_b);
  gca__sim_marker_t *ma = event_marker(a), *mb = event_marker(b);
  if ((a->flags | b->flags) & GCA_EVENT_DISABLE_TIMING) {
    st = gca__error(GCA_ERR_INVALID_HANDLE,
                    "event_elapsed: event %p was created with DISABLE_TIMING",
                    (void *)((a->flags & GCA_EVENT_DISABLE_TIMING) ? start : end));
  } else if (!ma || !mb) {
    st = gca__error(GCA_ERR_INVALID_HANDLE, "event_elapsed: event %p was never recorded",
                    (void *)(!ma ? start : end));
  } else if (!marker_done(ma) || !marker_done(mb)) {
    st = gca__error(GCA_ERR_NOT_READY, "event_elapsed: event %p has not completed",
                    (void *)(!marker_done(ma) ? start : end));
  } else {
    *ms = (float)(((double)mb->time_ns - (double)ma->time_ns) / 1e6);
  }
  gca__sim_marker_unref(ma);
  gca__sim_marker_unref(mb);
  gca__sim_obj_unref(&b->obj);
fail_b:
  gca__sim_obj_unref(&a->obj);
  return st;
}

static gca_status_t sim_stream_wait_event(gca_stream_t stream, gca_event_t event) {
  GCA_SIM_ENTER(stream_wait_event, 0);
  GCA_CHECK(gca__sim_stream_canon("stream_wait_event", &stream));
  sim_stream_t *s = NULL;
  sim_event_t *e = NULL;
  gca_status_t st;
  bool captured = false;
  GCA_CHECK(stream_get("stream_wait_event", stream, &s));
  GCA_CHECK_GOTO(event_get("stream_wait_event", event, &e), st, fail_event);
  gca__sim_marker_t *m = event_marker(e);
  bool blocking = s->legacy || !(s->flags & GCA_STREAM_NON_BLOCKING);
  GCA_CHECK_GOTO(gca__sim_capture_wait("stream_wait_event", stream, s->dev, blocking, s->legacy,
                                       event, m != NULL, &captured),
                 st, out);
  if (!captured && m)
    st = stream_wait_marker("stream_wait_event", s, m);
out:
  gca__sim_marker_unref(m);
  gca__sim_obj_unref(&e->obj);
fail_event:
  stream_unref(s);
  return st;
}

void gca__sim_stream_ops(gca_device_ops_t *ops) {
  ops->ctx_synchronize = sim_ctx_synchronize;
  ops->ctx_set_device = sim_ctx_set_device;
  ops->ctx_get_device = sim_ctx_get_device;
  ops->stream_get_device = sim_stream_get_device;
  ops->stream_create = sim_stream_create;
  ops->stream_destroy = sim_stream_destroy;
  ops->stream_synchronize = sim_stream_synchronize;
  ops->stream_query = sim_stream_query;
  ops->stream_wait_event = sim_stream_wait_event;
  ops->event_create = sim_event_create;
  ops->event_destroy = sim_event_destroy;
  ops->event_record = sim_event_record;
  ops->event_query = sim_event_query;
  ops->event_synchronize = sim_event_synchronize;
  ops->event_elapsed = sim_event_elapsed;
  gca__sim_work_ops(ops);
}
