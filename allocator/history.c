/* SPDX-License-Identifier: Apache-2.0 */
/* history.c - the recorders the allocator reports to: per-device rings of
 * recent events (behind snapshots' device_traces), the GCA_TRACE file in
 * RMM's log CSV format, and the public trace observers
 * (gca_trace_observer_add).
 *
 * The one idea: a single atomic bit set says which recorders are on, and the
 * allocator's hot path reads it once, relaxed, and returns when it is zero.
 * Everything else (ring locks, native frames, the trace writer, the observer
 * registry) sits behind that test. A ring is sized lazily to the capacity last configured, keeping
 * its newest entries, so reconfiguring never has to stop the allocator.
 */
#include "history.h"
#include "tcache.h"

#include "alloc_core.h"

#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES        64
#define TRACE_BUFFER_BYTES (1u << 20)

enum { ON_HISTORY = 1u, ON_TRACE = 2u, ON_OBSERVERS = 4u };

atomic_uint gca__history_recorders;
static atomic_size_t ring_capacity;
static atomic_bool want_stacks;
static atomic_int devices_seen; /* 1 + the highest device that recorded */

/* A device's ring. Invariants (under lock): count <= cap; entries == NULL iff
 * cap == 0; the oldest entry is entries[start], the newest
 * entries[(start + count - 1) % cap]. */
typedef struct ring {
  pthread_mutex_t lock;
  gca_history_entry_t *entries;
  size_t cap, start, count;
} ring_t;

static ring_t rings[MAX_DEVICES] = {[0 ... MAX_DEVICES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static void *(*ring_alloc)(size_t) = malloc; /* tests swap it to fail */

/* The trace file. Invariant: the ON_TRACE bit is set only while f != NULL. */
static struct {
  pthread_mutex_t lock;
  FILE *f;
  char *path;
  uint64_t start_ns;
  bool atexit_registered;
} trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_int next_thread_id = 1;
static _Thread_local int thread_id;

const char *gca__history_action_name(gca_history_action_t action) {
  static const char *const names[] = {
#define GCA__HA_NAME(name, str) str,
      GCA_HISTORY_ACTION_MAP(GCA__HA_NAME)
#undef GCA__HA_NAME
  };
  if ((unsigned)action >= GCA_ARRAY_SIZE(names))
    return "unknown";
  return names[action];
}

int gca__history_device_count(void) {
  return atomic_load(&devices_seen);
}

/* Frees a ring's entries (ring locked). */
static void ring_clear(ring_t *r) {
  free(r->entries);
  r->entries = NULL;
  r->cap = r->start = r->count = 0;
}

/* Moves a ring into `e`, an array of `cap` entries, keeping the newest (ring
 * locked). */
static void ring_install(ring_t *r, gca_history_entry_t *e, size_t cap) {
  size_t keep = r->count < cap ? r->count : cap;
  for (size_t i = 0; i < keep; i++)
    e[i] = r->entries[(r->start + r->count - keep + i) % r->cap];
  free(r->entries);
  r->entries = e;
  r->cap = cap;
  r->start = 0;
  r->count = keep;
}

/* Brings a ring to `cap` entries, keeping the newest (ring locked). False when
 * memory is short; the ring is then unchanged. */
static bool ring_resize(ring_t *r, size_t cap) {
  gca_history_entry_t *e = ring_alloc(cap * sizeof(*e));
  if (!e)
    return false;
  ring_install(r, e, cap);
  return true;
}

static void ring_push(ring_t *r, const gca_history_entry_t *e) {
  size_t cap = atomic_load_explicit(&ring_capacity, memory_order_relaxed);
  if (r->cap != cap && !ring_resize(r, cap) && r->cap == 0)
    return;
  if (r->count < r->cap) {
    r->entries[(r->start + r->count) % r->cap] = *e;
    r->count++;
  } else {
    r->entries[r->start] = *e;
    r->start = (r->start + 1) % r->cap;
  }
}

static void trace_row(const char *action, gca_devptr_t addr, uint64_t size, gca_stream_t stream) {
  if (thread_id == 0)
    thread_id = atomic_fetch_add(&next_thread_id, 1);
  uint64_t now = gca__now_ns();
  pthread_mutex_lock(&trace.lock);
  if (trace.f) {
    uint64_t us = now > trace.start_ns ? (now - trace.start_ns) / 1000 : 0;
    fprintf(trace.f, "%d,%02llu:%02llu:%02llu.%06llu,%s,0x%llx,%llu,0x%llx\n", thread_id,
            (unsigned long long)(us / 3600000000ull), (unsigned long long)(us / 60000000ull % 60),
            (unsigned long long)(us / 1000000ull % 60), (unsigned long long)(us % 1000000ull),
            action, (unsigned long long)addr, (unsigned long long)size,
            (unsigned long long)(uintptr_t)stream);
  }
  pthread_mutex_unlock(&trace.lock);
}

/* ---- trace observers ----
 *
 * Note [Trace observers]: the registry is a fixed array of slots under a
 * read-write lock. Events take it for reading (devices report in parallel);
 * add and remove take it for writing, so when remove returns no call of the
 * removed observer is running and none can start. The ON_OBSERVERS bit is set
 * while at least one slot is used, under the write lock. A callback runs with
 * its device's allocator lock and the registry's read lock held; a thread-local
 * flag makes add/remove from inside a callback an error instead of a deadlock.
 * Invariant (under the lock): nobservers == the number of slots with id != 0. */
static struct {
  pthread_rwlock_t lock;
  struct {
    gca_trace_observer_handle_t id; /* 0: free slot */
    gca_trace_observer_fn fn;
    void *ctx;
  } slot[GCA_TRACE_OBSERVERS_MAX];
  int nobservers;
  gca_trace_observer_handle_t next_id;
} observers = {.lock = PTHREAD_RWLOCK_INITIALIZER, .next_id = 1};
static _Thread_local bool in_observer;

/* The public action of each history action; -1: not reported. */
static int public_action(gca_history_action_t a) {
  switch (a) {
  case GCA_HA_ALLOC:
    return GCA_TRACE_ALLOC;
  case GCA_HA_FREE_REQUESTED:
    return GCA_TRACE_FREE_REQUESTED;
  case GCA_HA_FREE_COMPLETED:
    return GCA_TRACE_FREE_COMPLETED;
  case GCA_HA_SEGMENT_ALLOC:
    return GCA_TRACE_SEGMENT_ALLOC;
  case GCA_HA_SEGMENT_FREE:
    return GCA_TRACE_SEGMENT_FREE;
  case GCA_HA_SEGMENT_MAP:
    return GCA_TRACE_SEGMENT_MAP;
  case GCA_HA_SEGMENT_UNMAP:
    return GCA_TRACE_SEGMENT_UNMAP;
  case GCA_HA_OOM:
    return GCA_TRACE_OOM;
  default:
    return -1;
  }
}

/* Calls every observer (the device's lock is held by the caller, so its
 * statistics are those after the event). */
static void notify_observers(gca_history_action_t action, int device, gca_devptr_t addr,
                             uint64_t size, gca_stream_t stream) {
  int a = public_action(action);
  if (a < 0)
    return;
  gca_trace_event_t ev = {.action = (gca_trace_action_t)a,
                          .device = device,
                          .address = addr,
                          .size = size,
                          .stream = stream};
  gca__devalloc_t *d = gca__devalloc_peek(device);
  if (d != NULL) {
    gca__tc_fold(d, 0); /* the thread caches' last frees (Note [Thread caches]) */
    ev.reserved_bytes = (uint64_t)d->stats.reserved_bytes[GCA_STAT_ALL].current;
    ev.allocated_bytes = (uint64_t)d->stats.allocated_bytes[GCA_STAT_ALL].current;
  }
  pthread_rwlock_rdlock(&observers.lock);
  in_observer = true;
  for (int i = 0; i < GCA_TRACE_OBSERVERS_MAX; i++)
    if (observers.slot[i].id != 0)
      observers.slot[i].fn(&ev, observers.slot[i].ctx);
  in_observer = false;
  pthread_rwlock_unlock(&observers.lock);
}

GCA_API gca_status_t gca_trace_observer_add(gca_trace_observer_fn fn, void *ctx,
                                            gca_trace_observer_handle_t *handle) {
  if (fn == NULL || handle == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "trace_observer_add: the %s is NULL",
                      fn == NULL ? "function" : "handle output");
  if (in_observer)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "trace_observer_add: called from inside a trace observer");
  gca_status_t st = GCA_OK;
  bool first = false;
  pthread_rwlock_wrlock(&observers.lock);
  int free_slot = -1;
  for (int i = 0; i < GCA_TRACE_OBSERVERS_MAX && free_slot < 0; i++)
    if (observers.slot[i].id == 0)
      free_slot = i;
  if (free_slot < 0) {
    st = gca__error(GCA_ERR_INVALID_STATE, "trace_observer_add: all %d observer slots are taken",
                    GCA_TRACE_OBSERVERS_MAX);
    goto out;
  }
  observers.slot[free_slot].fn = fn;
  observers.slot[free_slot].ctx = ctx;
  observers.slot[free_slot].id = observers.next_id++;
  *handle = observers.slot[free_slot].id;
  first = observers.nobservers++ == 0;
  if (first)
    atomic_fetch_or(&gca__history_recorders, ON_OBSERVERS);
out:
  pthread_rwlock_unlock(&observers.lock);
  if (first)
    gca__fc_gates_shut(); /* the leaf hits stop before this returns (Note [Leaf gate]) */
  return st;
}

GCA_API gca_status_t gca_trace_observer_remove(gca_trace_observer_handle_t handle) {
  if (in_observer)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "trace_observer_remove: called from inside a trace observer");
  bool found = false;
  pthread_rwlock_wrlock(&observers.lock);
  for (int i = 0; handle != 0 && i < GCA_TRACE_OBSERVERS_MAX && !found; i++) {
    if (observers.slot[i].id != handle)
      continue;
    observers.slot[i].id = 0;
    observers.slot[i].fn = NULL;
    observers.slot[i].ctx = NULL;
    if (--observers.nobservers == 0)
      atomic_fetch_and(&gca__history_recorders, ~ON_OBSERVERS);
    found = true;
  }
  pthread_rwlock_unlock(&observers.lock);
  if (!found)
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "trace_observer_remove: handle %llu is not an attached observer",
                      (unsigned long long)handle);
  return GCA_OK;
}

/* Everything behind the hot path's test. Kept out of line so that the test
 * stays a load and a branch; frames[0..1] are this function and its caller. */
__attribute__((noinline)) static void record_slow(unsigned on, gca_history_action_t action,
                                                  int device, gca_devptr_t addr, uint64_t size,
                                                  gca_stream_t stream) {
  if (on & ON_OBSERVERS)
    notify_observers(action, device, addr, size, stream);
  if ((on & ON_TRACE) && (action == GCA_HA_ALLOC || action == GCA_HA_FREE_REQUESTED))
    trace_row(action == GCA_HA_ALLOC ? "allocate" : "free", addr, size, stream);
  if (!(on & ON_HISTORY) || device < 0 || device >= MAX_DEVICES)
    return;
  gca_history_entry_t e = {.action = action,
                           .device = device,
                           .addr = addr,
                           .size = size,
                           .stream = stream,
                           .time_ns = gca__now_ns(),
                           .nframes = 0};
  if (atomic_load_explicit(&want_stacks, memory_order_relaxed)) {
    void *frames[GCA_HISTORY_MAX_FRAMES + 2];
    int n = backtrace(frames, GCA_ARRAY_SIZE(frames));
    if (n > 2) {
      e.nframes = n - 2;
      memcpy(e.frames, frames + 2, (size_t)e.nframes * sizeof(void *));
    }
  }
  ring_t *r = &rings[device];
  pthread_mutex_lock(&r->lock);
  if (atomic_load(&gca__history_recorders) & ON_HISTORY) {
    ring_push(r, &e);
    int seen = atomic_load_explicit(&devices_seen, memory_order_relaxed);
    while (seen <= device && !atomic_compare_exchange_weak(&devices_seen, &seen, device + 1))
      ;
  }
  pthread_mutex_unlock(&r->lock);
}

void gca__history_event_slow(gca_history_action_t action, int device, gca_devptr_t addr,
                             uint64_t size, gca_stream_t stream) {
  unsigned on = atomic_load_explicit(&gca__history_recorders, memory_order_relaxed);
  if (on == 0)
    return;
  record_slow(on, action, device, addr, size, stream);
  __asm__ volatile("" ::: "memory"); /* no tail call: keeps this frame for the frame count */
}

void gca__history_alloc_failure(int device, uint64_t size, gca_stream_t stream) {
  GCA_UNUSED(device);
  if (GCA_LIKELY((atomic_load_explicit(&gca__history_recorders, memory_order_relaxed) & ON_TRACE) ==
                 0))
    return;
  trace_row("allocate failure", 0, size, stream);
}

void gca__history_set_alloc(void *(*fn)(size_t)) {
  ring_alloc = fn ? fn : malloc;
}

/* Sizes the rings of every device seen so far (at least device 0) to `cap`
 * before the capacity is published, so that a ring the host cannot hold is
 * an error here rather than events dropped later. All or nothing: on a
 * failed allocation no ring and no setting changes. Caller holds config_lock. */
static gca_status_t rings_presize(size_t cap) {
  int n = atomic_load(&devices_seen);
  if (n < 1)
    n = 1;
  gca_history_entry_t *fresh[MAX_DEVICES] = {0};
  for (int d = 0; d < n; d++) {
    fresh[d] = ring_alloc(cap * sizeof(gca_history_entry_t));
    if (!fresh[d]) {
      for (int k = 0; k < d; k++)
        free(fresh[k]);
      return gca__error(GCA_ERR_OUT_OF_MEMORY,
                        "record_history: host out of memory for a ring of %zu entries (%zu bytes) "
                        "on device %d; the previous history is kept",
                        cap, cap * sizeof(gca_history_entry_t), d);
    }
  }
  atomic_store(&ring_capacity, cap);
  for (int d = 0; d < n; d++) {
    pthread_mutex_lock(&rings[d].lock);
    if (rings[d].cap != cap)
      ring_install(&rings[d], fresh[d], cap);
    else
      free(fresh[d]);
    pthread_mutex_unlock(&rings[d].lock);
  }
  return GCA_OK;
}

gca_status_t gca__history_configure(bool enabled, size_t max_entries, bool stacks) {
  if (enabled && max_entries == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "record_history: max_entries must be at least 1");
  if (enabled && max_entries > GCA_HISTORY_MAX_ENTRIES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "record_history: max_entries %zu is more than the %zu a ring may hold",
                      max_entries, (size_t)GCA_HISTORY_MAX_ENTRIES);
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&config_lock);
  if (!enabled) {
    atomic_fetch_and(&gca__history_recorders, ~ON_HISTORY);
    for (int d = 0; d < MAX_DEVICES; d++) {
      pthread_mutex_lock(&rings[d].lock);
      ring_clear(&rings[d]);
      pthread_mutex_unlock(&rings[d].lock);
    }
    atomic_store(&want_stacks, false);
  } else if ((st = rings_presize(max_entries)) == GCA_OK) {
    if (stacks) {
      void *warm[2];
      backtrace(warm, 2); /* loads the unwinder now rather than inside an allocation */
    }
    atomic_store(&want_stacks, stacks);
    atomic_fetch_or(&gca__history_recorders, ON_HISTORY);
  }
  pthread_mutex_unlock(&config_lock);
  if (enabled && st == GCA_OK)
    gca__fc_gates_shut(); /* Note [Leaf gate] */
  return st;
}

gca_status_t gca__history_copy(int device, gca_history_entry_t **entries, size_t *count) {
  if (!entries || !count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "history_copy: NULL output");
  if (device < 0 || device >= MAX_DEVICES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "history_copy: device %d out of range (0..%d)",
                      device, MAX_DEVICES - 1);
  ring_t *r = &rings[device];
  pthread_mutex_lock(&r->lock);
  size_t cap = atomic_load(&ring_capacity);
  size_t n = r->count < cap ? r->count : cap;
  gca_history_entry_t *out = NULL;
  if (n > 0) {
    out = malloc(n * sizeof(*out));
    if (!out) {
      pthread_mutex_unlock(&r->lock);
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "history_copy: cannot copy %zu entries of device %d",
                        n, device);
    }
    for (size_t i = 0; i < n; i++)
      out[i] = r->entries[(r->start + r->count - n + i) % r->cap];
  }
  pthread_mutex_unlock(&r->lock);
  *entries = out;
  *count = n;
  return GCA_OK;
}

static void trace_atexit(void) {
  gca__trace_close();
}

gca_status_t gca__trace_open_from_env(void) {
  const char *path = gca__getenv("GCA_TRACE");
  if (!path || !*path)
    return GCA_OK;
  pthread_mutex_lock(&trace.lock);
  if (trace.f) {
    pthread_mutex_unlock(&trace.lock);
    return GCA_OK;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    char eb[128];
    const char *why = strerror_r(errno, eb, sizeof(eb));
    pthread_mutex_unlock(&trace.lock);
    GCA_LOG_WARN("trace: cannot open GCA_TRACE file '%s': %s; allocations continue untraced", path,
                 why);
    return GCA_OK;
  }
  char *copy = strdup(path);
  setvbuf(f, NULL, _IOFBF, TRACE_BUFFER_BYTES);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n", f);
  trace.f = f;
  free(trace.path);
  trace.path = copy;
  trace.start_ns = gca__now_ns();
  if (!trace.atexit_registered)
    trace.atexit_registered = atexit(trace_atexit) == 0;
  atomic_fetch_or(&gca__history_recorders, ON_TRACE);
  pthread_mutex_unlock(&trace.lock);
  gca__fc_gates_shut(); /* Note [Leaf gate] */
  return GCA_OK;
}

void gca__trace_close(void) {
  pthread_mutex_lock(&trace.lock);
  atomic_fetch_and(&gca__history_recorders, ~ON_TRACE);
  if (trace.f) {
    bool failed = fflush(trace.f) != 0 || ferror(trace.f);
    failed = fclose(trace.f) != 0 || failed;
    if (failed)
      GCA_LOG_WARN("trace: writing GCA_TRACE file '%s' failed; the trace is incomplete",
                   trace.path ? trace.path : "?");
    trace.f = NULL;
  }
  free(trace.path);
  trace.path = NULL;
  pthread_mutex_unlock(&trace.lock);
}
