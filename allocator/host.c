/* SPDX-License-Identifier: Apache-2.0 */
/* host.c - the caching host allocator (gca/host.h): pinned blocks from the
 * jemalloc arena of host_extent.c, reused only when the streams that used
 * them are done, as PyTorch's CachingHostAllocator.
 *
 * The one idea: jemalloc does the caching (size classes, per-thread caches,
 * the arena's never-decaying dirty pages); this file adds what jemalloc cannot
 * know: which pointers are live blocks (host_blocks.c: foreign pointers and
 * double frees are refused instead of corrupting the arena), which streams
 * used a block, and the deferred free of such a block until an event recorded
 * on each of those streams at free time has completed (Note [Deferred host
 * frees]); and, in front of jemalloc, a small cache per thread that serves a
 * repeated size without a jemalloc call or a table lookup (Note [Host front
 * cache]).
 *
 * Note [Host thread caches]: each thread gets an explicit jemalloc tcache
 * (tcache.create) used through MALLOCX_TCACHE, so repeated sizes are served
 * without touching the arena, and a front cache of its own (Note [Host front
 * cache]). An explicit tcache must not be used by two threads at once, and
 * gca_host_empty_cache must flush them all (and may destroy the arena under
 * them), so the owner uses its tcache and its front cache only inside a
 * section that empty_cache can shut (tc_enter / tc_exit, below); a thread's
 * caches are flushed and its tcache destroyed when the thread exits. No lock
 * of the owner's section is ever held while host.mu is taken (empty_cache
 * takes them in the other order).
 *
 * Note [Host front cache]: a thread keeps the blocks it frees, by size class
 * (jemalloc's: four per doubling, 16 B up to 1 MiB), in bins of its own:
 * LIFO lists of their records (Note [Host block records]) that stay in the
 * table meanwhile, CACHED. A malloc of a cached class pops one and turns it
 * LIVE with a store; a free finds the record through the thread's hints (a
 * direct-mapped table of the blocks it handed out, stale entries allowed),
 * takes it with a load and a store (Note [Host block records]) and pushes it.
 * So the common pair makes no jemalloc call, no locked instruction and
 * touches no line another thread writes: about 175 instructions, fewer than
 * plain jemalloc's mallocx+dallocx (195), where the table and jemalloc's
 * explicit-arena path cost 620. A block freed by another thread than the one
 * that allocated it is found through the table, then cached by the freeing
 * thread. A bin holds at most 64 blocks and at most 1 MiB (at least one
 * block), a thread at most 4 MiB in all; blocks that do not fit, larger
 * blocks and blocks recorded on streams take jemalloc's path. empty_cache and
 * the thread's exit give the bins back to jemalloc. The cost: up to 4 MiB of
 * pinned memory per thread that other threads cannot reuse until then.
 *
 * Note [Deferred host frees]: gca_host_free of a block recorded on streams
 * records one event per stream (events are pooled) and parks the block; every
 * later alloc, free and empty_cache first returns the parked blocks whose
 * events have all completed to jemalloc. Until then the block is neither live
 * (a second free is refused) nor reusable. If an event cannot be recorded,
 * the free fails and the block stays live, so the caller may retry.
 *
 * Note [Emptying the pinned arena]: jemalloc retains pieces of the extents it
 * carved (Note [Pinned extents]); arena.<i>.purge gives back only whole
 * extents. When no block is live or parked, empty_cache instead destroys the
 * arena (every extent unpinned and freed) and the next allocation creates a
 * fresh one, so an idle allocator holds no pinned memory afterwards. "No
 * block" is read from the counts (Note [Host statistics]) with every owner's
 * section shut and every front cache flushed, and a block is counted inside
 * the section that hands it out (from the front cache or mallocx) and
 * uncounted inside the section that caches it or gives it to sdallocx (a
 * parked block stays counted), so equal counts mean no pointer into the arena
 * is held anywhere, even by a thread between its claim of a block and its
 * section. Consequently allocation.current counts freed blocks still waiting
 * for their events.
 */
#include <jemalloc/jemalloc.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.h"
#include "device.h"
#include "gca/host.h"
#include "host_internal.h"
#include "json.h"

#define MAX_SIZE ((size_t)1 << 46)

/* Note [Host front cache]: classes up to FRONT_MAX in FRONT_BINS bins. */
#define FRONT_MAX       ((size_t)1 << 20)
#define FRONT_BINS      60u
#define FRONT_BIN_MAX   64u
#define FRONT_BIN_BYTES ((size_t)1 << 20)
#define FRONT_BYTES     ((size_t)4 << 20)
#define HINTS_LG        8u

typedef struct parked {
  struct parked *next;
  void *ptr;
  size_t size, jsize;
  uint32_t nevents;
  gca_event_t events[];
} parked_t;

/* Note [Host statistics]: counted per thread, by the owner only (relaxed
 * loads and stores, no read-modify-write on a shared line: the hot path's
 * cost), summed by readers. A thread's current may go negative (it freed what
 * another allocated); the sum is exact. Peaks are of the sum, taken whenever
 * a thread's own current reaches a new high (rare once warm) and at every
 * read, so a peak made only of lows of several threads can be missed, and
 * after gca_host_reset_peak_stats a thread samples again only above its old
 * high (the highs are its own, never written by another thread). */
typedef struct counts {
  _Atomic int64_t allocs, frees, bytes_allocated, bytes_freed;
} counts_t;

/* A front cache bin: cached records of one class, newest first. */
typedef struct fbin {
  gca__host_rec_t *head;
  uint32_t room; /* blocks it may still take */
} fbin_t;

/* Where the record of a block this thread handed out is (maybe stale). */
typedef struct hint {
  uintptr_t ptr;
  gca__host_rec_t *rec;
} hint_t;

/* Note [Host thread caches] for active/blocked/m. bins and room_bytes: the
 * owner's, inside its sections (empty_cache's while they are shut); hints:
 * the owner's alone. */
typedef struct tcache {
  _Alignas(64) _Atomic int active; /* the owner is inside a fast section */
  _Atomic int blocked;             /* empty_cache holds m: sections take m instead */
  pthread_mutex_t m;
  unsigned id;
  struct tcache *next;
  counts_t c;
  int64_t high_allocs, high_bytes; /* the owner's own current highs */
  size_t room_bytes;               /* bytes the front cache may still take */
  fbin_t bins[FRONT_BINS];
  hint_t hints[1u << HINTS_LG];
} tcache_t;

static struct {
  pthread_once_t once;
  _Atomic bool ready; /* init_once ran and succeeded */
  gca_status_t init_st;
  char init_detail[1024];
  const gca__je_t *je;
  bool use_register;
  unsigned register_threads;
  pthread_key_t key;
  /* registry: arena swap, tcache list, parked list, event pool */
  pthread_mutex_t mu;
  _Atomic bool have_arena; /* written under mu with every tcache held (empty_cache) */
  bool asym;               /* membarrier available: owners' sections take no lock */
  _Atomic unsigned arena;
  tcache_t *tcaches;
  parked_t *parked;
  _Atomic int64_t nparked;
  gca_event_t *events;
  size_t nevents, capevents;
  /* statistics (Note [Host statistics]); retired: threads that exited. Under mu. */
  counts_t retired;
  int64_t peak_allocs, peak_bytes;
} host = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local tcache_t *t_cache __attribute__((tls_model("initial-exec")));

/* ---- front cache classes (jemalloc's size classes) ---- */

/* The bin of a size in [1, FRONT_MAX]: 16 B steps up to 128 B, then four
 * classes per doubling. */
static inline uint32_t bin_of(size_t size) {
  if (size <= 128)
    return (uint32_t)((size - 1) >> 4);
  unsigned lg = 63u - (unsigned)__builtin_clzll(size - 1);
  return 8u + (lg - 7u) * 4u + (uint32_t)(((size - 1) >> (lg - 2)) - 4);
}

/* The class size of bin b: what jemalloc is asked for. */
static size_t bin_size(uint32_t b) {
  if (b < 8)
    return (size_t)(b + 1) << 4;
  unsigned lg = 7u + (b - 8u) / 4u, q = 4u + (b - 8u) % 4u;
  return (size_t)(q + 1) << (lg - 2);
}

static uint32_t bin_room(uint32_t b) {
  size_t n = FRONT_BIN_BYTES / bin_size(b);
  return n == 0 ? 1 : n > FRONT_BIN_MAX ? FRONT_BIN_MAX : (uint32_t)n;
}

static inline hint_t *hint_of(tcache_t *tc, uintptr_t p) {
  return &tc->hints[((p >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - HINTS_LG)];
}

static void front_init(tcache_t *tc) {
  for (uint32_t b = 0; b < FRONT_BINS; b++)
    tc->bins[b] = (fbin_t){.head = NULL, .room = bin_room(b)};
  tc->room_bytes = FRONT_BYTES;
}

/* Gives every block of t's front cache back to jemalloc through t's tcache;
 * inside t's section, or with it shut. */
static void front_flush(tcache_t *t) {
  for (uint32_t b = 0; b < FRONT_BINS; b++)
    for (gca__host_rec_t *r = t->bins[b].head, *next; r; r = next) {
      next = r->next;
      void *p = (void *)atomic_load_explicit(&r->ptr, memory_order_relaxed);
      size_t jsize = r->jsize;
      gca__host_rec_drop(r);
      host.je->sdallocx(p, jsize, MALLOCX_TCACHE(t->id));
    }
  front_init(t);
}

/* ---- statistics ---- */

static void bump(_Atomic int64_t *x, int64_t v) {
  atomic_store_explicit(x, atomic_load_explicit(x, memory_order_relaxed) + v, memory_order_relaxed);
}

static int64_t get(_Atomic int64_t *x) {
  return atomic_load_explicit(x, memory_order_relaxed);
}

static void counts_add(counts_t *sum, counts_t *c) {
  bump(&sum->allocs, get(&c->allocs));
  bump(&sum->frees, get(&c->frees));
  bump(&sum->bytes_allocated, get(&c->bytes_allocated));
  bump(&sum->bytes_freed, get(&c->bytes_freed));
}

/* The totals over every thread, and the peaks updated with them. Under mu. */
static counts_t totals_locked(void) {
  counts_t sum = {0};
  counts_add(&sum, &host.retired);
  for (tcache_t *t = host.tcaches; t; t = t->next)
    counts_add(&sum, &t->c);
  int64_t allocs = get(&sum.allocs) - get(&sum.frees);
  int64_t bytes = get(&sum.bytes_allocated) - get(&sum.bytes_freed);
  if (allocs > host.peak_allocs)
    host.peak_allocs = allocs;
  if (bytes > host.peak_bytes)
    host.peak_bytes = bytes;
  return sum;
}

/* Counts an allocation on the owner's counters; samples the peaks at a new own high. */
/* Counted inside the owner's section (Note [Emptying the pinned arena]). */
static void count_alloc(tcache_t *tc, size_t size) {
  bump(&tc->c.allocs, 1);
  bump(&tc->c.bytes_allocated, (int64_t)size);
}

/* Samples the peaks when the owner's own current reached a new high; outside
 * any section (takes host.mu). */
static __attribute__((noinline)) void sample_peaks_slow(tcache_t *tc, int64_t allocs,
                                                        int64_t bytes) {
  tc->high_allocs = allocs > tc->high_allocs ? allocs : tc->high_allocs;
  tc->high_bytes = bytes > tc->high_bytes ? bytes : tc->high_bytes;
  pthread_mutex_lock(&host.mu);
  totals_locked();
  pthread_mutex_unlock(&host.mu);
}

static inline void sample_peaks(tcache_t *tc) {
  int64_t allocs = get(&tc->c.allocs) - get(&tc->c.frees);
  int64_t bytes = get(&tc->c.bytes_allocated) - get(&tc->c.bytes_freed);
  if (GCA_UNLIKELY(allocs > tc->high_allocs || bytes > tc->high_bytes))
    sample_peaks_slow(tc, allocs, bytes);
}

static void count_free(tcache_t *tc, size_t size) {
  bump(&tc->c.frees, 1);
  bump(&tc->c.bytes_freed, (int64_t)size);
}

/* ---- setup, arena and thread caches ---- */

static bool tc_enter(tcache_t *tc);
static void tc_exit(tcache_t *tc, bool fast);

static void tcache_exit(void *arg) {
  tcache_t *tc = arg;
  t_cache = NULL; /* a later destructor's call makes a new one */
  bool fast = tc_enter(tc);
  front_flush(tc);
  tc_exit(tc, fast);
  pthread_mutex_lock(&host.mu);
  counts_add(&host.retired, &tc->c);
  for (tcache_t **pp = &host.tcaches; *pp; pp = &(*pp)->next)
    if (*pp == tc) {
      *pp = tc->next;
      break;
    }
  pthread_mutex_unlock(&host.mu);
  if (host.je->mallctl("tcache.destroy", NULL, NULL, &tc->id, sizeof(tc->id)) != 0)
    GCA_LOG_WARN("host: mallctl(\"tcache.destroy\") failed for tcache %u", tc->id);
  pthread_mutex_destroy(&tc->m);
  free(tc);
}

static void init_once(void) {
  host.je = gca__je_get("gca_host");
  if (!host.je) {
    host.init_st = GCA_ERR_NOT_SUPPORTED;
    goto fail;
  }
  gca_alloc_config_t cfg;
  host.init_st = gca__config_from_env(&cfg);
  if (host.init_st != GCA_OK)
    goto fail;
  host.use_register = cfg.pinned_use_host_register;
  host.register_threads = cfg.pinned_num_register_threads;
  host.asym = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  if (pthread_key_create(&host.key, tcache_exit) != 0) {
    host.init_st = gca__error(GCA_ERR_INTERNAL, "gca_host: no thread-specific key left");
    goto fail;
  }
  return;
fail:
  snprintf(host.init_detail, sizeof(host.init_detail), "%s", gca_last_error());
}

static gca_status_t ready_slow(void) {
  pthread_once(&host.once, init_once);
  if (host.init_st != GCA_OK)
    return gca__error(host.init_st, "%s", host.init_detail);
  atomic_store_explicit(&host.ready, true, memory_order_release);
  return GCA_OK;
}

/* GCA_OK once initialization succeeded (one acquire load after that). */
static inline gca_status_t ready(const char *fn) {
  (void)fn;
  if (GCA_LIKELY(atomic_load_explicit(&host.ready, memory_order_acquire)))
    return GCA_OK;
  return ready_slow();
}

/* The calling thread's tcache, created on first use; NULL with the error set. */
static tcache_t *my_tcache(const char *fn) {
  if (GCA_LIKELY(t_cache != NULL))
    return t_cache;
  tcache_t *tc = GCA_FAILPOINT("host_tcache") ? NULL : aligned_alloc(64, sizeof(*tc));
  if (!tc) {
    gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a thread cache", fn);
    return NULL;
  }
  memset(tc, 0, sizeof(*tc));
  size_t len = sizeof(tc->id);
  int r = host.je->mallctl("tcache.create", &tc->id, &len, NULL, 0);
  if (r != 0) {
    free(tc);
    gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: mallctl(\"tcache.create\") failed: %s", fn, strerror(r));
    return NULL;
  }
  pthread_mutex_init(&tc->m, NULL);
  front_init(tc);
  pthread_mutex_lock(&host.mu);
  tc->next = host.tcaches;
  host.tcaches = tc;
  pthread_mutex_unlock(&host.mu);
  pthread_setspecific(host.key, tc);
  t_cache = tc;
  return tc;
}

/* Note [Host thread caches] (the sections): the owner marks itself active
 * with a plain store, a compiler barrier and a load of `blocked`; empty_cache
 * takes every tcache's m, sets blocked, runs membarrier
 * (MEMBARRIER_CMD_PRIVATE_EXPEDITED: a full barrier on every CPU running a
 * thread of the process, which turns the owners' compiler barriers into
 * fences, Dekker-style), then waits for each active to drop. An owner that
 * sees blocked takes m, which empty_cache holds until it is done. So the hot
 * path makes no atomic read-modify-write for its tcache, and only
 * empty_cache pays (microseconds). Without membarrier every section takes m. */
static inline bool tc_enter(tcache_t *tc) {
  if (GCA_LIKELY(host.asym)) {
    atomic_store_explicit(&tc->active, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (GCA_LIKELY(!atomic_load_explicit(&tc->blocked, memory_order_acquire)))
      return true;
    atomic_store_explicit(&tc->active, 0, memory_order_release);
  }
  pthread_mutex_lock(&tc->m);
  return false;
}

static inline void tc_exit(tcache_t *tc, bool fast) {
  if (GCA_LIKELY(fast))
    atomic_store_explicit(&tc->active, 0, memory_order_release);
  else
    pthread_mutex_unlock(&tc->m);
}

/* Every owner out of its section and kept out. Under host.mu. */
static void block_sections(void) {
  for (tcache_t *t = host.tcaches; t; t = t->next) {
    pthread_mutex_lock(&t->m);
    atomic_store_explicit(&t->blocked, 1, memory_order_relaxed);
  }
  if (!host.asym)
    return;
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
    GCA_ASSERT(!"membarrier failed after it was registered");
  for (tcache_t *t = host.tcaches; t; t = t->next)
    for (unsigned i = 0; atomic_load_explicit(&t->active, memory_order_acquire); i++)
      if (i > 128)
        sched_yield();
}

static void unblock_sections(void) {
  for (tcache_t *t = host.tcaches; t; t = t->next) {
    atomic_store_explicit(&t->blocked, 0, memory_order_release);
    pthread_mutex_unlock(&t->m);
  }
}

/* The arena, created if none. Under host.mu. */
static gca_status_t arena_locked(const char *fn, unsigned *arena) {
  if (!atomic_load(&host.have_arena)) {
    unsigned a;
    gca_status_t st = gca__host_arena_create(host.je, host.use_register, host.register_threads, &a);
    if (st != GCA_OK)
      return gca__error_prefix(st, "%s", fn);
    atomic_store(&host.arena, a);
    atomic_store(&host.have_arena, true);
  }
  *arena = atomic_load(&host.arena);
  return GCA_OK;
}

/* ---- deferred frees ---- */

/* Returns a parked block to jemalloc through the caller's tcache. */
static void give_back(tcache_t *tc, void *p, size_t jsize, size_t size) {
  bool fast = tc_enter(tc);
  host.je->sdallocx(p, jsize, MALLOCX_TCACHE(tc->id));
  count_free(tc, size);
  tc_exit(tc, fast);
}

static void pool_event(gca_event_t e, const gca_device_ops_t *ops) {
  if (host.nevents == host.capevents) {
    size_t cap = host.capevents ? host.capevents * 2 : 16;
    gca_event_t *v = realloc(host.events, cap * sizeof(*v));
    if (!v) {
      GCA_CHECK_IGNORE(ops->event_destroy(e));
      return;
    }
    host.events = v;
    host.capevents = cap;
  }
  host.events[host.nevents++] = e;
}

/* Returns parked blocks whose events completed to jemalloc. A query that fails
 * for another reason than "not ready" keeps the block parked (logged). */
static void process_parked_slow(tcache_t *tc);

static inline void process_parked(tcache_t *tc) {
  if (GCA_UNLIKELY(atomic_load_explicit(&host.nparked, memory_order_relaxed) != 0))
    process_parked_slow(tc);
}

static void process_parked_slow(tcache_t *tc) {
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  /* no event is queried while a capture runs: Note [Queries during another
   * thread's capture] (pending.c) */
  if (!ops || !gca__device_wait_enter()) /* Note [Capture gate] (device.c) */
    return;
  parked_t *done = NULL;
  pthread_mutex_lock(&host.mu);
  for (parked_t **pp = &host.parked; *pp;) {
    parked_t *b = *pp;
    bool complete = true;
    for (uint32_t i = 0; i < b->nevents && complete; i++) {
      gca_status_t q = ops->event_query(b->events[i]);
      if (q != GCA_OK) {
        if (q != GCA_ERR_NOT_READY)
          GCA_LOG_WARN("gca_host: event of parked block %p: %s", b->ptr, gca_last_error());
        complete = false;
      }
    }
    if (!complete) {
      pp = &b->next;
      continue;
    }
    *pp = b->next;
    for (uint32_t i = 0; i < b->nevents; i++)
      pool_event(b->events[i], ops);
    b->next = done;
    done = b;
    atomic_fetch_sub(&host.nparked, 1);
  }
  pthread_mutex_unlock(&host.mu);
  gca__device_wait_leave();
  while (done) {
    parked_t *next = done->next;
    give_back(tc, done->ptr, done->jsize, done->size);
    free(done);
    done = next;
  }
}

/* ---- API ---- */

/* A miss of the front cache, or a size beyond it: jemalloc, and a new record. */
static gca_status_t alloc_slow(tcache_t *tc, const char *fn, size_t size, void **ptr) {
  uint32_t b = size <= FRONT_MAX ? bin_of(size) : GCA__HOST_NOBIN;
  size_t jsize = b != GCA__HOST_NOBIN ? bin_size(b) : size;
  void *p;
  gca__host_rec_t *r = NULL;
  for (;;) {
    if (GCA_UNLIKELY(!atomic_load_explicit(&host.have_arena, memory_order_acquire))) {
      unsigned a;
      pthread_mutex_lock(&host.mu);
      gca_status_t st = arena_locked(fn, &a);
      pthread_mutex_unlock(&host.mu);
      if (st != GCA_OK)
        return st;
    }
    bool fast = tc_enter(tc);
    if (GCA_UNLIKELY(!atomic_load_explicit(&host.have_arena, memory_order_relaxed))) {
      tc_exit(tc, fast); /* empty_cache destroyed it in between */
      continue;
    }
    unsigned arena = atomic_load_explicit(&host.arena, memory_order_relaxed);
    p = host.je->mallocx(jsize, MALLOCX_ARENA(arena) | MALLOCX_TCACHE(tc->id));
    if (p && (r = gca__host_rec_add(p, jsize, b, size)) != NULL) {
      *hint_of(tc, (uintptr_t)p) = (hint_t){(uintptr_t)p, r};
      count_alloc(tc, size);
    } else if (p) {
      host.je->sdallocx(p, jsize, MALLOCX_TCACHE(tc->id));
    }
    tc_exit(tc, fast);
    break;
  }
  if (!p) {
    char why[512];
    gca__host_extent_take_error(why, sizeof(why));
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: cannot pin %zu bytes of host memory: %s", fn,
                      size, why[0] ? why : "jemalloc found no memory");
  }
  if (!r)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to track a block of %zu bytes", fn,
                      size);
  sample_peaks(tc);
  *ptr = p;
  return GCA_OK;
}

/* Pops the newest block of bin (Note [Host front cache]) as a live block of
 * `size` bytes; in the owner's section. */
static inline void *front_take(tcache_t *tc, fbin_t *bin, size_t size) {
  gca__host_rec_t *r = bin->head;
  bin->head = r->next;
  bin->room++;
  tc->room_bytes += r->jsize;
  atomic_store_explicit(&r->size, size, memory_order_relaxed);
  atomic_store_explicit(&r->state, GCA__HREC_LIVE, memory_order_release);
  uintptr_t p = atomic_load_explicit(&r->ptr, memory_order_relaxed);
  *hint_of(tc, p) = (hint_t){p, r};
  count_alloc(tc, size);
  return (void *)p;
}

/* gca_host_alloc past its fast path: first calls, bad input, parked blocks
 * to complete, misses of the front cache and sizes beyond it. */
static __attribute__((noinline)) gca_status_t alloc_generic(void **ptr, size_t size) {
  static const char fn[] = "gca_host_alloc";
  if (!ptr)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  *ptr = NULL;
  GCA_CHECK(ready(fn));
  if (size == 0)
    return GCA_OK;
  if (size > MAX_SIZE)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "%s: %zu bytes is more pinned host memory than can exist (at most %zu)", fn,
                      size, MAX_SIZE);
  tcache_t *tc = my_tcache(fn);
  if (!tc)
    return GCA_ERR_OUT_OF_MEMORY;
  process_parked(tc);
  if (size <= FRONT_MAX) {
    fbin_t *bin = &tc->bins[bin_of(size)];
    bool fast = tc_enter(tc);
    void *p = bin->head ? front_take(tc, bin, size) : NULL;
    tc_exit(tc, fast);
    if (p) {
      sample_peaks(tc);
      *ptr = p;
      return GCA_OK;
    }
  }
  return alloc_slow(tc, fn, size, ptr);
}

/* The fast path: a thread with a thread cache (so initialized), nothing
 * parked, a size the front cache holds and a block in its bin. */
GCA_API gca_status_t gca_host_alloc(void **ptr, size_t size) {
  tcache_t *tc = t_cache;
  if (GCA_LIKELY(tc != NULL && ptr != NULL && size - 1 < FRONT_MAX &&
                 atomic_load_explicit(&host.nparked, memory_order_relaxed) == 0)) {
    fbin_t *bin = &tc->bins[bin_of(size)];
    bool fast = tc_enter(tc);
    if (GCA_LIKELY(bin->head != NULL)) {
      void *p = front_take(tc, bin, size);
      tc_exit(tc, fast);
      sample_peaks(tc);
      *ptr = p;
      return GCA_OK;
    }
    tc_exit(tc, fast);
  }
  return alloc_generic(ptr, size);
}

/* Records an event on each stream r was used by (Note [Deferred host
 * frees]) into a new parked block; r is claimed. */
static gca_status_t park_prepare(const char *fn, gca__host_rec_t *r, parked_t **out) {
  void *ptr = (void *)atomic_load_explicit(&r->ptr, memory_order_relaxed);
  uint32_t nuses = atomic_load_explicit(&r->nuses, memory_order_relaxed);
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return gca__error_prefix(st, "%s", fn);
  parked_t *pk =
      GCA_FAILPOINT("host_park") ? NULL : malloc(sizeof(*pk) + nuses * sizeof(gca_event_t));
  if (!pk)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory to defer the free of %p", fn, ptr);
  *pk = (parked_t){
      .ptr = ptr, .size = atomic_load_explicit(&r->size, memory_order_relaxed), .jsize = r->jsize};
  for (uint32_t i = 0; i < nuses; i++) {
    gca_event_t e = NULL;
    pthread_mutex_lock(&host.mu);
    if (host.nevents)
      e = host.events[--host.nevents];
    pthread_mutex_unlock(&host.mu);
    if (!e && (st = ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e)) != GCA_OK)
      goto fail;
    pk->events[pk->nevents++] = e;
    if ((st = ops->event_record(e, r->uses[i])) != GCA_OK)
      goto fail;
  }
  *out = pk;
  return GCA_OK;
fail:
  gca__error_prefix(st, "%s: deferring the free of %p", fn, ptr);
  pthread_mutex_lock(&host.mu);
  for (uint32_t i = 0; i < pk->nevents; i++)
    pool_event(pk->events[i], ops);
  pthread_mutex_unlock(&host.mu);
  free(pk);
  return st;
}

/* The free of claimed r, recorded on streams: parked, or live again when an
 * event cannot be recorded. */
static gca_status_t free_deferred(tcache_t *tc, const char *fn, gca__host_rec_t *r) {
  parked_t *pk = NULL;
  gca_status_t st = park_prepare(fn, r, &pk);
  if (st != GCA_OK) {
    gca__host_rec_unclaim(r);
    return st;
  }
  gca__host_rec_drop(r);
  pthread_mutex_lock(&host.mu);
  pk->next = host.parked;
  host.parked = pk;
  atomic_fetch_add(&host.nparked, 1);
  pthread_mutex_unlock(&host.mu);
  process_parked(tc);
  return GCA_OK;
}

/* Whether claimed r, used by no stream, fits in the front cache. */
static inline bool front_fits(const tcache_t *tc, const gca__host_rec_t *r) {
  return r->bin != GCA__HOST_NOBIN && tc->bins[r->bin].room != 0 && r->jsize <= tc->room_bytes;
}

/* Pushes claimed r (front_fits) into its bin; in the owner's section. */
static inline void front_put(tcache_t *tc, gca__host_rec_t *r) {
  fbin_t *bin = &tc->bins[r->bin];
  r->next = bin->head;
  bin->head = r;
  bin->room--;
  tc->room_bytes -= r->jsize;
  atomic_store_explicit(&r->state, GCA__HREC_CACHED, memory_order_release);
  count_free(tc, atomic_load_explicit(&r->size, memory_order_relaxed));
}

/* The free of claimed r past the fast path: deferred for its streams, into
 * the front cache, or back to jemalloc. */
static __attribute__((noinline)) gca_status_t free_claimed(tcache_t *tc, const char *fn,
                                                           gca__host_rec_t *r) {
  if (atomic_load_explicit(&r->nuses, memory_order_relaxed) != 0)
    return free_deferred(tc, fn, r);
  bool fast = tc_enter(tc);
  if (front_fits(tc, r)) {
    front_put(tc, r);
  } else {
    void *p = (void *)atomic_load_explicit(&r->ptr, memory_order_relaxed);
    size_t jsize = r->jsize, size = atomic_load_explicit(&r->size, memory_order_relaxed);
    gca__host_rec_drop(r);
    host.je->sdallocx(p, jsize, MALLOCX_TCACHE(tc->id));
    count_free(tc, size);
  }
  tc_exit(tc, fast);
  process_parked(tc);
  return GCA_OK;
}

/* gca_host_free past its fast path: first calls, NULL, pointers without a
 * hint (freed by another thread than the one that allocated them, or not
 * live), blocks recorded on streams or that do not fit the front cache. */
static __attribute__((noinline)) gca_status_t free_generic(void *ptr) {
  static const char fn[] = "gca_host_free";
  if (!ptr)
    return GCA_OK;
  GCA_CHECK(ready(fn));
  tcache_t *tc = my_tcache(fn);
  if (!tc)
    return GCA_ERR_OUT_OF_MEMORY;
  gca__host_rec_t *r;
  GCA_CHECK(gca__host_rec_claim(fn, ptr, NULL, &r));
  return free_claimed(tc, fn, r);
}

/* The fast path: the thread's hint finds the block's record, taken with a
 * load and a store (Note [Host block records]), into the front cache. */
GCA_API gca_status_t gca_host_free(void *ptr) {
  tcache_t *tc = t_cache;
  if (GCA_LIKELY(tc != NULL && ptr != NULL)) {
    hint_t *h = hint_of(tc, (uintptr_t)ptr);
    gca__host_rec_t *r = h->rec;
    if (GCA_LIKELY(h->ptr == (uintptr_t)ptr && gca__host_rec_take(r, ptr))) {
      if (GCA_LIKELY(atomic_load_explicit(&r->nuses, memory_order_relaxed) == 0)) {
        bool fast = tc_enter(tc);
        if (GCA_LIKELY(front_fits(tc, r))) {
          front_put(tc, r);
          tc_exit(tc, fast);
          process_parked(tc);
          return GCA_OK;
        }
        tc_exit(tc, fast);
      }
      return free_claimed(tc, "gca_host_free", r);
    }
  }
  return free_generic(ptr);
}

GCA_API gca_status_t gca_host_record_stream(void *ptr, gca_stream_t stream) {
  static const char fn[] = "gca_host_record_stream";
  GCA_CHECK(ready(fn));
  tcache_t *tc = t_cache;
  hint_t *h = tc ? hint_of(tc, (uintptr_t)ptr) : NULL;
  gca__host_rec_t *r;
  GCA_CHECK(gca__host_rec_claim(fn, ptr, h && h->ptr == (uintptr_t)ptr ? h->rec : NULL, &r));
  gca_status_t st = gca__host_rec_add_use(fn, r, stream);
  gca__host_rec_unclaim(r);
  return st;
}

GCA_API gca_status_t gca_host_empty_cache(void) {
  static const char fn[] = "gca_host_empty_cache";
  GCA_CHECK(ready(fn));
  tcache_t *tc = my_tcache(fn);
  if (!tc)
    return GCA_ERR_OUT_OF_MEMORY;
  process_parked(tc);
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&host.mu);
  block_sections();
  for (tcache_t *t = host.tcaches; t; t = t->next) {
    front_flush(t);
    if (host.je->mallctl("tcache.flush", NULL, NULL, &t->id, sizeof(t->id)) != 0)
      GCA_LOG_WARN("%s: mallctl(\"tcache.flush\") failed for tcache %u", fn, t->id);
  }
  if (atomic_load(&host.have_arena)) {
    unsigned a = atomic_load(&host.arena);
    counts_t sum = totals_locked();
    bool idle = get(&sum.allocs) == get(&sum.frees) && atomic_load(&host.nparked) == 0;
    if (idle) {
      st = gca__host_arena_destroy(host.je, a);
      if (st == GCA_OK)
        atomic_store(&host.have_arena, false);
    } else {
      st = gca__host_arena_purge(host.je, a);
    }
  } else {
    gca__host_extent_retry_orphans();
  }
  unblock_sections();
  pthread_mutex_unlock(&host.mu);
  return st;
}

GCA_API gca_status_t gca_host_get_stats(gca_host_stats_t *out) {
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "gca_host_get_stats: stats is NULL");
  memset(out, 0, sizeof(*out));
  pthread_mutex_lock(&host.mu);
  counts_t sum = totals_locked();
  out->allocation = (gca_stat_t){get(&sum.allocs) - get(&sum.frees), host.peak_allocs,
                                 get(&sum.allocs), get(&sum.frees)};
  out->allocated_bytes =
      (gca_stat_t){get(&sum.bytes_allocated) - get(&sum.bytes_freed), host.peak_bytes,
                   get(&sum.bytes_allocated), get(&sum.bytes_freed)};
  pthread_mutex_unlock(&host.mu);
  gca__host_extent_stats_t e;
  gca__host_extent_stats(&e);
  out->segment = (gca_stat_t){e.segments, e.segments_peak, e.segments_allocated, e.segments_freed};
  out->reserved_bytes = (gca_stat_t){e.reserved_bytes, e.reserved_bytes_peak,
                                     e.reserved_bytes_allocated, e.reserved_bytes_freed};
  out->num_host_alloc = e.num_host_alloc;
  out->num_host_free = e.num_host_free;
  out->host_alloc_time =
      (gca_host_duration_stat_t){e.alloc_us_total, e.alloc_us_max, e.num_host_alloc};
  out->host_free_time = (gca_host_duration_stat_t){e.free_us_total, e.free_us_max, e.num_host_free};
  out->pending_frees = atomic_load(&host.nparked);
  return GCA_OK;
}

GCA_API void gca_host_reset_peak_stats(void) {
  pthread_mutex_lock(&host.mu);
  host.peak_allocs = host.peak_bytes = 0;
  totals_locked();
  pthread_mutex_unlock(&host.mu);
  gca__host_extent_reset_peaks();
}

/* ---- snapshot ---- */

static void write_block(gca_json_writer_t *w, uintptr_t ptr, size_t size, const char *state,
                        uint32_t streams) {
  gca__json_object_begin(w);
  gca__json_key(w, "address");
  gca__json_uint(w, ptr);
  gca__json_key(w, "size");
  gca__json_uint(w, size);
  gca__json_key(w, "state");
  gca__json_string(w, state);
  gca__json_key(w, "streams");
  gca__json_uint(w, streams);
  gca__json_object_end(w);
}

static void write_live(void *ctx, const void *ptr, size_t size, uint32_t nuses) {
  write_block(ctx, (uintptr_t)ptr, size, "active_allocated", nuses);
}

/* The live and pending blocks as a JSON array (empty before the host
 * allocator was first used: the snapshot does not start it). */
void gca__host_snapshot_write(gca_json_writer_t *w) {
  gca__json_array_begin(w);
  if (atomic_load_explicit(&host.ready, memory_order_acquire)) {
    gca__host_blocks_walk(write_live, w);
    pthread_mutex_lock(&host.mu);
    for (parked_t *p = host.parked; p; p = p->next)
      write_block(w, (uintptr_t)p->ptr, p->size, "active_pending_free", p->nevents);
    pthread_mutex_unlock(&host.mu);
  }
  gca__json_array_end(w);
}

GCA_API gca_status_t gca_host_snapshot_json(char **json) {
  static const char fn[] = "gca_host_snapshot_json";
  if (!json)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: json is NULL", fn);
  *json = NULL;
  GCA_CHECK(ready(fn));
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__host_snapshot_write(&w);
  gca_status_t st = gca__json_writer_finish(&w, json, NULL);
  return st == GCA_OK ? GCA_OK : gca__error_prefix(st, "%s", fn);
}
