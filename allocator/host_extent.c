/* SPDX-License-Identifier: Apache-2.0 */
/* host_extent.c - the jemalloc arena whose extents are pinned host memory.
 *
 * Note [Pinned extents]: a dedicated arena (arenas.create with our
 * extent_hooks_t) gets all its memory from alloc_hook, which pins exactly the
 * extent jemalloc asks for: host_alloc (cuMemHostAlloc), or mmap + host_register
 * (cuMemHostRegister) under pinned_use_cuda_host_register:True, with the pages
 * first touched by pinned_num_register_threads threads in parallel ranges for
 * large extents, as PyTorch does. Each such extent is a *chunk* (one driver
 * allocation), recorded in a sorted table. jemalloc grows an arena
 * geometrically when it retains memory (opt.retain, on by default on 64-bit
 * Linux): it asks for 2 MiB, then larger chunks, and carves them itself, so
 * the driver sees a few large calls, not one per slab. Rules that follow:
 *   - split is allowed (a piece stays inside its chunk); merge only within
 *     one chunk (two chunks adjacent in address space are two pins);
 *   - dalloc of a whole chunk unpins and frees it (false: done); of a piece,
 *     it answers true, so jemalloc retains the piece for reuse;
 *   - decommit answers true (page-locked memory cannot be partly given back),
 *     commit false (always committed), no purge hooks;
 *   - destroy (arena.<i>.destroy) accumulates per chunk and frees the chunk
 *     once all of it was destroyed.
 * A driver failure in alloc_hook makes mallocx return NULL; its detail is kept
 * per thread for host.c's message. A failure to free a chunk in destroy keeps
 * it on the table as orphaned, retried by the next purge or destroy, so no
 * pinned memory is lost track of.
 *
 * Dirty pages never decay (dirty_decay_ms = muzzy_decay_ms = -1): the arena
 * is the cache, emptied only by gca_host_empty_cache.
 */
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device.h"
#include "host_internal.h"
#include "introspect.h"

#define PARALLEL_TOUCH_MIN (16u << 20)
#define MAX_TOUCH_THREADS  128u

typedef struct chunk {
  uintptr_t base;
  size_t size;
  size_t destroyed; /* bytes destroy_hook returned; the chunk goes at size */
  bool registered;  /* mmap + host_register, else host_alloc */
  bool orphaned;    /* all destroyed, but freeing it failed: retry */
} chunk_t;

static struct {
  pthread_mutex_t mu;
  chunk_t *v; /* sorted by base, disjoint */
  size_t n, cap;
  bool use_register;
  unsigned register_threads;
  gca__host_extent_stats_t st;
} ext = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Note [Hook errors]: a hook cannot return a status, so a failing one leaves
 * its detail in the thread's last error (gca__error, as the failing device
 * op already did) and sets t_failed, which says that detail belongs to a hook
 * failure since the last take. One byte of thread-local storage: libgca's
 * static TLS must stay small enough for a dlopen() after program start
 * (Python loading it), which glibc serves from a small surplus. */
static _Thread_local bool t_failed;

/* The failing call set the detail already. */
static void fail_last(void) {
  t_failed = true;
}

static void fail_msg(const char *msg) {
  gca__error(GCA_ERR_OUT_OF_MEMORY, "%s", msg);
  t_failed = true;
}

void gca__host_extent_take_error(char *buf, size_t len) {
  if (t_failed)
    snprintf(buf, len, "%s", gca_last_error());
  else if (len > 0)
    buf[0] = '\0';
  t_failed = false;
}

/* Index of the chunk containing p, or n. Under mu. */
static size_t find(uintptr_t p) {
  size_t lo = 0, hi = ext.n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ext.v[mid].base + ext.v[mid].size <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < ext.n && ext.v[lo].base <= p ? lo : ext.n;
}

/* Adds a chunk (never fails for one unrecord() just took off: n < cap). */
static bool record(uintptr_t base, size_t size, bool registered) {
  if (ext.n == ext.cap) {
    size_t cap = ext.cap ? ext.cap * 2 : 32;
    chunk_t *v = realloc(ext.v, cap * sizeof(*v));
    if (!v)
      return false;
    ext.v = v;
    ext.cap = cap;
  }
  size_t i = 0;
  while (i < ext.n && ext.v[i].base < base)
    i++;
  memmove(&ext.v[i + 1], &ext.v[i], (ext.n - i) * sizeof(*ext.v));
  ext.v[i] = (chunk_t){.base = base, .size = size, .registered = registered};
  ext.n++;
  gca__host_extent_stats_t *s = &ext.st;
  s->segments++;
  s->segments_allocated++;
  if (s->segments > s->segments_peak)
    s->segments_peak = s->segments;
  s->reserved_bytes += (int64_t)size;
  s->reserved_bytes_allocated += (int64_t)size;
  if (s->reserved_bytes > s->reserved_bytes_peak)
    s->reserved_bytes_peak = s->reserved_bytes;
  return true;
}

static void timed(int64_t us, int64_t *total, int64_t *max) {
  *total += us;
  if (us > *max)
    *max = us;
}

typedef struct touch {
  char *p;
  size_t len;
} touch_t;

static void *touch_range(void *arg) {
  touch_t *t = arg;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (size_t off = 0; off < t->len; off += page)
    ((volatile char *)t->p)[off] = 0;
  return NULL;
}

/* Faults in [p, p+len) with up to n threads in parallel page ranges. */
static void touch_pages(char *p, size_t len, unsigned n) {
  pthread_t th[MAX_TOUCH_THREADS];
  touch_t parts[MAX_TOUCH_THREADS];
  size_t page = (size_t)sysconf(_SC_PAGESIZE), per = (len / n + page - 1) & ~(page - 1);
  unsigned started = 0;
  for (unsigned i = 0; i < n && (size_t)i * per < len; i++) {
    size_t off = (size_t)i * per;
    parts[i] = (touch_t){p + off, len - off < per ? len - off : per};
    if (i == 0 || pthread_create(&th[started], NULL, touch_range, &parts[i]) != 0)
      touch_range(&parts[i]);
    else
      started++;
  }
  for (unsigned i = 0; i < started; i++)
    pthread_join(th[i], NULL);
}

/* Pins a new chunk of `size` bytes; NULL after fail_last/fail_msg on failure. */
static void *pin_chunk(size_t size) {
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops) {
    fail_last();
    return NULL;
  }
  void *p = NULL;
  uint64_t t0 = gca__now_ns();
  if (ext.use_register) {
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      fail_msg("mmap: no host memory");
      return NULL;
    }
    if (ext.register_threads > 1 && size >= PARALLEL_TOUCH_MIN)
      touch_pages(p, size, ext.register_threads);
    st = ops->host_register(p, size);
    if (st != GCA_OK) {
      fail_last();
      munmap(p, size);
      p = NULL;
    }
  } else {
    st = ops->host_alloc(size, &p);
    if (st != GCA_OK) {
      fail_last();
      p = NULL;
    }
  }
  int64_t us = (int64_t)((gca__now_ns() - t0) / 1000u);
  pthread_mutex_lock(&ext.mu);
  ext.st.num_host_alloc++;
  timed(us, &ext.st.alloc_us_total, &ext.st.alloc_us_max);
  if (p && (GCA_FAILPOINT("host_chunk_table") || !record((uintptr_t)p, size, ext.use_register))) {
    pthread_mutex_unlock(&ext.mu);
    if (ext.use_register) {
      GCA_CHECK_IGNORE(ops->host_unregister(p));
      munmap(p, size);
    } else {
      GCA_CHECK_IGNORE(ops->host_free(p));
    }
    fail_msg("no host memory to record a pinned extent");
    return NULL;
  }
  pthread_mutex_unlock(&ext.mu);
  return p;
}

/* Unpins and frees chunk i, which the caller took off the table (a copy). */
static gca_status_t unpin_chunk(const chunk_t *c) {
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return st;
  uint64_t t0 = gca__now_ns();
  if (c->registered) {
    st = ops->host_unregister((void *)c->base);
    if (st == GCA_OK)
      munmap((void *)c->base, c->size);
  } else {
    st = ops->host_free((void *)c->base);
  }
  int64_t us = (int64_t)((gca__now_ns() - t0) / 1000u);
  pthread_mutex_lock(&ext.mu);
  ext.st.num_host_free++;
  timed(us, &ext.st.free_us_total, &ext.st.free_us_max);
  pthread_mutex_unlock(&ext.mu);
  return st;
}

/* Removes chunk i and accounts for it. Under mu. */
static chunk_t unrecord(size_t i) {
  chunk_t c = ext.v[i];
  memmove(&ext.v[i], &ext.v[i + 1], (ext.n - i - 1) * sizeof(*ext.v));
  ext.n--;
  ext.st.segments--;
  ext.st.segments_freed++;
  ext.st.reserved_bytes -= (int64_t)c.size;
  ext.st.reserved_bytes_freed += (int64_t)c.size;
  return c;
}

/* Puts c back on the table as orphaned: freeing it failed; retried later. */
static void keep_orphan(chunk_t c) {
  pthread_mutex_lock(&ext.mu);
  if (record(c.base, c.size, c.registered)) {
    size_t j = find(c.base);
    ext.v[j].orphaned = true;
    ext.v[j].destroyed = c.size;
    /* it never left: undo the totals unrecord and record moved */
    ext.st.segments_allocated--;
    ext.st.segments_freed--;
    ext.st.reserved_bytes_allocated -= (int64_t)c.size;
    ext.st.reserved_bytes_freed -= (int64_t)c.size;
  } else {
    GCA_LOG_ERR("host: lost track of a pinned extent at %p", (void *)c.base);
  }
  pthread_mutex_unlock(&ext.mu);
}

/* Frees chunk c; on failure keeps it as an orphan. */
static void release_chunk(chunk_t c) {
  if (unpin_chunk(&c) == GCA_OK)
    return;
  GCA_LOG_WARN("host: could not give back a pinned extent of %zu bytes at %p: %s (retried by "
               "gca_host_empty_cache)",
               c.size, (void *)c.base, gca_last_error());
  keep_orphan(c);
}

/* ---- the hooks (jemalloc: true means failure or opt-out) ---- */

static void *alloc_hook(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
                        bool *zero, bool *commit, unsigned arena_ind) {
  pthread_mutex_lock(&ext.mu);
  ext.st.hook_alloc++;
  pthread_mutex_unlock(&ext.mu);
  if (new_addr)
    return NULL; /* a pinned extent cannot be placed at a chosen address */
  void *p = pin_chunk(size);
  if (p && ((uintptr_t)p & (alignment - 1)) != 0) {
    pthread_mutex_lock(&ext.mu);
    chunk_t c = unrecord(find((uintptr_t)p));
    pthread_mutex_unlock(&ext.mu);
    release_chunk(c);
    fail_msg("the pinned extent is not aligned as jemalloc asked");
    return NULL;
  }
  if (p) {
    *zero = ext.use_register; /* fresh anonymous pages */
    *commit = true;
  }
  return p;
}

static bool dalloc_hook(extent_hooks_t *h, void *addr, size_t size, bool committed,
                        unsigned arena_ind) {
  pthread_mutex_lock(&ext.mu);
  ext.st.hook_dalloc++;
  size_t i = find((uintptr_t)addr);
  bool whole = i < ext.n && ext.v[i].base == (uintptr_t)addr && ext.v[i].size == size &&
               ext.v[i].destroyed == 0;
  chunk_t c = {0};
  if (whole)
    c = unrecord(i);
  pthread_mutex_unlock(&ext.mu);
  if (!whole)
    return true; /* a piece: jemalloc retains it */
  /* Unpinning failed: jemalloc is told it is gone all the same (it would
   * forget a base block anyway) and the chunk is retried as an orphan. */
  release_chunk(c);
  return false;
}

static void destroy_hook(extent_hooks_t *h, void *addr, size_t size, bool committed,
                         unsigned arena_ind) {
  pthread_mutex_lock(&ext.mu);
  ext.st.hook_destroy++;
  size_t i = find((uintptr_t)addr);
  bool done = false;
  chunk_t c = {0};
  if (i < ext.n) {
    ext.v[i].destroyed += size;
    if (ext.v[i].destroyed >= ext.v[i].size) {
      c = unrecord(i);
      done = true;
    }
  }
  pthread_mutex_unlock(&ext.mu);
  if (done)
    release_chunk(c);
}

static bool commit_hook(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
                        unsigned arena_ind) {
  return false;
}

static bool decommit_hook(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
                          unsigned arena_ind) {
  pthread_mutex_lock(&ext.mu);
  ext.st.hook_decommit++;
  pthread_mutex_unlock(&ext.mu);
  return true;
}

static bool split_hook(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                       bool committed, unsigned arena_ind) {
  pthread_mutex_lock(&ext.mu);
  ext.st.hook_split++;
  pthread_mutex_unlock(&ext.mu);
  return false;
}

static bool merge_hook(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned arena_ind) {
  pthread_mutex_lock(&ext.mu);
  ext.st.hook_merge++;
  size_t i = find((uintptr_t)addr_a);
  bool same = i < ext.n && (uintptr_t)addr_b + size_b <= ext.v[i].base + ext.v[i].size &&
              (uintptr_t)addr_b >= ext.v[i].base;
  pthread_mutex_unlock(&ext.mu);
  return !same;
}

static extent_hooks_t hooks = {
    .alloc = alloc_hook,
    .dalloc = dalloc_hook,
    .destroy = destroy_hook,
    .commit = commit_hook,
    .decommit = decommit_hook,
    .purge_lazy = NULL,
    .purge_forced = NULL,
    .split = split_hook,
    .merge = merge_hook,
};

/* ---- arenas ---- */

static gca_status_t ctl_arena(const gca__je_t *je, const char *op, unsigned arena, const char *leaf,
                              void *newp, size_t newlen) {
  char name[64];
  snprintf(name, sizeof(name), "arena.%u.%s", arena, leaf);
  int r = je->mallctl(name, NULL, NULL, newp, newlen);
  if (r != 0)
    return gca__error(GCA_ERR_INTERNAL, "%s: mallctl(\"%s\") failed: %s", op, name, strerror(r));
  return GCA_OK;
}

gca_status_t gca__host_arena_create(const gca__je_t *je, bool use_register,
                                    unsigned register_threads, unsigned *arena) {
  pthread_mutex_lock(&ext.mu);
  ext.use_register = use_register;
  ext.register_threads = register_threads > MAX_TOUCH_THREADS ? MAX_TOUCH_THREADS
                         : register_threads == 0              ? 1
                                                              : register_threads;
  pthread_mutex_unlock(&ext.mu);
  unsigned a = 0;
  size_t len = sizeof(a);
  extent_hooks_t *hp = &hooks;
  int r = je->mallctl("arenas.create", &a, &len, &hp, sizeof(hp));
  if (r != 0) {
    char why[512];
    gca__host_extent_take_error(why, sizeof(why));
    return gca__error(
        GCA_ERR_OUT_OF_MEMORY,
        "cannot pin host memory for a new arena's metadata: %s (mallctl(\"arenas.create\"): %s)",
        why[0] ? why : "no reason given", strerror(r));
  }
  ssize_t never = -1;
  gca_status_t st = ctl_arena(je, "host", a, "dirty_decay_ms", &never, sizeof(never));
  if (st == GCA_OK)
    st = ctl_arena(je, "host", a, "muzzy_decay_ms", &never, sizeof(never));
  if (st != GCA_OK) {
    GCA_CHECK_IGNORE(gca__host_arena_destroy(je, a));
    return st;
  }
  *arena = a;
  return GCA_OK;
}

void gca__host_extent_retry_orphans(void) {
  for (;;) {
    pthread_mutex_lock(&ext.mu);
    size_t i = 0;
    while (i < ext.n && !ext.v[i].orphaned)
      i++;
    if (i == ext.n) {
      pthread_mutex_unlock(&ext.mu);
      return;
    }
    chunk_t c = unrecord(i);
    pthread_mutex_unlock(&ext.mu);
    if (unpin_chunk(&c) != GCA_OK) {
      keep_orphan(c);
      return;
    }
  }
}

gca_status_t gca__host_arena_destroy(const gca__je_t *je, unsigned arena) {
  gca__host_extent_retry_orphans();
  return ctl_arena(je, "gca_host_empty_cache", arena, "destroy", NULL, 0);
}

gca_status_t gca__host_arena_purge(const gca__je_t *je, unsigned arena) {
  gca__host_extent_retry_orphans();
  return ctl_arena(je, "gca_host_empty_cache", arena, "purge", NULL, 0);
}

void gca__host_extent_stats(gca__host_extent_stats_t *out) {
  pthread_mutex_lock(&ext.mu);
  *out = ext.st;
  pthread_mutex_unlock(&ext.mu);
}

void gca__host_extent_reset_peaks(void) {
  pthread_mutex_lock(&ext.mu);
  ext.st.segments_peak = ext.st.segments;
  ext.st.reserved_bytes_peak = ext.st.reserved_bytes;
  ext.st.alloc_us_max = ext.st.free_us_max = 0;
  pthread_mutex_unlock(&ext.mu);
}

bool gca__host_extent_contains(const void *p, size_t len) {
  pthread_mutex_lock(&ext.mu);
  size_t i = find((uintptr_t)p);
  bool in = i < ext.n && (uintptr_t)p + len <= ext.v[i].base + ext.v[i].size;
  pthread_mutex_unlock(&ext.mu);
  return in;
}

bool gca__host_owns(const void *ptr) {
  return ptr != NULL && gca__host_extent_contains(ptr, 1);
}
