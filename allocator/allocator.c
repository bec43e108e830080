/* SPDX-License-Identifier: Apache-2.0 */
/* allocator.c - the device registry and the public entry points: each
 * device's allocator created on first use, gca_malloc / gca_free and their
 * cache-hit fast paths, record_stream, pointer lookups, settings,
 * empty_cache, limits, out-of-memory observers, and the teardown (the
 * statistics are read and reset in stats.c).
 *
 * The one idea: an entry point resolves the device and takes its lock, does
 * what it can in place (the free cache's hit and put, inline from fcache.h),
 * and otherwise goes down the floors one at a time, never back up: the free
 * cache (fcache.c), pending frees (pending.c), the pools' trees (blocks.c),
 * new segments and the out-of-memory retries (release.c, segment.c,
 * expandable.c, vmm.c). The module map in alloc_core.h draws the floors.
 * Each device has one allocator behind one mutex, which also guards its
 * pointer map; the cached alloc/free pair takes that mutex and nothing else,
 * and makes no device call and no host allocation.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expandable.h"
#include "fcache.h"
#include "history.h"
#include "introspect.h"
#include "recycle.h"
#include "tcache.h"

#define MAX_OBSERVERS 32

typedef struct observer {
  gca_oom_observer_t fn;
  void *ctx;
} observer_t;

/* Process-wide state; g_lock guards creation, configuration and observers. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_next_inst; /* the last gca__devalloc_t.inst given */
static _Atomic(gca__devalloc_t *) g_devs[GCA__MAX_DEVICES];
static atomic_int g_single_dev = -1;          /* the only device with an allocator, or -1 */
static _Atomic(gca__devalloc_t *) g_single_d; /* its allocator, or NULL: gca_free's one load */
static atomic_int g_ndevs;                    /* highest device index with an allocator + 1 */
static gca_alloc_config_t g_cfg;
static bool g_cfg_loaded;
static bool g_caching = true;
static bool g_trace_opened;
static observer_t g_observers[MAX_OBSERVERS];
static int g_nobservers;
static _Thread_local int t_device __attribute__((tls_model("initial-exec")));
/* t_device has been passed to the device layer's ctx_set_device on this thread. */
static _Thread_local bool t_device_told __attribute__((tls_model("initial-exec")));

#ifdef GCA_DEBUG_CHECKS
#define DEBUG_CHECK(d)                                        \
  do {                                                        \
    if (gca__devalloc_check_locked(d) != GCA_OK)              \
      gca__assert_fail(__FILE__, __LINE__, gca_last_error()); \
  } while (0)
#else
#define DEBUG_CHECK(d) ((void)0)
#endif

static void set_config_locked(gca__devalloc_t *d, const gca_alloc_config_t *cfg) {
  d->cfg = *cfg;
  d->has_divisions = false;
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
    d->has_divisions |= cfg->roundup_power2_divisions[i] > 1;
  d->stats.max_split_size =
      cfg->max_split_size >= (uint64_t)INT64_MAX ? -1 : (int64_t)cfg->max_split_size;
  d->small.gen++; /* the fit and split rules may have changed (Note [Exact hits]) */
  d->large.gen++;
  gca__caches_update(d);
}

/* ---- the device allocators ---- */

/* Loads the settings once; the caller holds g_lock. */
static gca_status_t config_load_locked(void) {
  if (g_cfg_loaded)
    return GCA_OK;
  gca_alloc_config_t cfg;
  GCA_CHECK(gca__config_from_env(&cfg));
  bool no_caching = false;
  const char *nc = gca__getenv("GCA_NO_CACHING");
  if (nc != NULL && *nc != '\0' && gca__parse_bool(nc, &no_caching) != GCA_OK)
    return gca__error(GCA_ERR_CONFIG, "GCA_NO_CACHING='%s' is not a boolean", nc);
  if (!g_trace_opened) {
    GCA_CHECK(gca__trace_open_from_env());
    g_trace_opened = true;
  }
  g_cfg = cfg;
  g_caching = !no_caching;
  g_cfg_loaded = true;
  return GCA_OK;
}

static void apply_limit_from_config(gca__devalloc_t *d) {
  if (d->cfg.per_process_memory_fraction > 0.0) {
    d->set_fraction = true;
    d->allowed_max = (size_t)(d->cfg.per_process_memory_fraction * (double)d->total_memory);
  }
}

gca__devalloc_t *gca__devalloc_peek(int device) {
  if (device < 0 || device >= GCA__MAX_DEVICES)
    return NULL;
  return atomic_load_explicit(&g_devs[device], memory_order_acquire);
}

static gca_status_t check_device_index(const char *op, int device, const gca_device_ops_t **ops) {
  gca_status_t st;
  const gca_device_ops_t *o = gca__device_get(&st);
  if (o == NULL)
    return gca__error_prefix(st, "%s", op);
  int n = 0;
  GCA_CHECK(o->device_count(&n));
  if (device < 0 || device >= n || device >= GCA__MAX_DEVICES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d is not in [0, %d)", op, device,
                      n < GCA__MAX_DEVICES ? n : GCA__MAX_DEVICES);
  if (ops != NULL)
    *ops = o;
  return GCA_OK;
}

static gca_status_t devalloc_create_locked(const char *op, int device, gca__devalloc_t **out) {
  const gca_device_ops_t *ops;
  gca_status_t st;
  GCA_CHECK(check_device_index(op, device, &ops));
  GCA_CHECK(config_load_locked());
  gca__devalloc_t *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: host out of memory for device %d", op, device);
  size_t free_bytes = 0;
  GCA_CHECK_GOTO(ops->mem_get_info(device, &free_bytes, &d->total_memory), st, fail);
  gca__mutex_init(&d->lock);
  pthread_mutex_init(&d->rel_mu, NULL);
  pthread_cond_init(&d->rel_cv, NULL);
  d->epoch = 1; /* a new block's fc_epoch (0) is never current */
  d->fc_gate =
      GCA__GATE_FC | GCA__GATE_RB; /* shut until a holder lets the lock go (Note [Leaf gate]) */
  d->device = device;
  d->inst = ++g_next_inst;
  d->ops = ops;
  set_config_locked(d, &g_cfg);
  d->caching = g_caching;
  d->small.dev = d->large.dev = d;
  d->small.is_small = true;
  apply_limit_from_config(d);
  gca__caches_update(d);
  bool first = true;
  for (int i = 0; i < GCA__MAX_DEVICES && first; i++)
    first = gca__devalloc_peek(i) == NULL;
  atomic_store(&g_single_dev, first ? device : -1);
  if (device + 1 > atomic_load(&g_ndevs))
    atomic_store(&g_ndevs, device + 1);
  atomic_store_explicit(&g_devs[device], d, memory_order_release);
  atomic_store_explicit(&g_single_d, first ? d : NULL, memory_order_release);
  atomic_store(&gca__stream_retire_hook, gca__streams_retire);
  *out = d;
  return GCA_OK;

fail:
  free(d);
  return st;
}

static gca_status_t devalloc_get_slow(const char *op, int device, gca__devalloc_t **out);

/* The allocator of `device`, created on first use. */
static inline gca_status_t devalloc_get(const char *op, int device, gca__devalloc_t **out) {
  gca__devalloc_t *d;
  if (GCA_LIKELY((unsigned)device < GCA__MAX_DEVICES &&
                 (d = atomic_load_explicit(&g_devs[device], memory_order_acquire)) != NULL)) {
    *out = d;
    return GCA_OK;
  }
  return devalloc_get_slow(op, device, out);
}

gca_status_t gca__devalloc_get(const char *op, int device, gca__devalloc_t **out) {
  return devalloc_get(op, device, out);
}

static gca_status_t devalloc_get_slow(const char *op, int device, gca__devalloc_t **out) {
  gca__devalloc_t *d;
  if (device < 0 || device >= GCA__MAX_DEVICES)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d is out of range", op, device);
  pthread_mutex_lock(&g_lock);
  gca_status_t st = GCA_OK;
  d = gca__devalloc_peek(device);
  if (d == NULL)
    st = devalloc_create_locked(op, device, &d);
  pthread_mutex_unlock(&g_lock);
  if (st == GCA_OK)
    *out = d;
  return st;
}

/* ---- malloc ---- */

/* The pool of a routed request: the matching private pool's tree of the same
 * size class, or `pool` when no route matches. */
static gca_status_t routed_pool(gca__devalloc_t *d, gca__pool_t **pool, gca_stream_t stream,
                                size_t rounded) {
  gca__mempool_t *m;
  GCA_CHECK(gca__route_select_locked(d, stream, &m));
  if (m != NULL)
    *pool = rounded <= GCA__SMALL_SIZE ? &m->small : &m->large;
  return GCA_OK;
}

static void oom_fail(gca__devalloc_t *d, size_t size, size_t seg_size, gca_stream_t stream) {
  char s_req[32], s_tot[32], s_free[32], s_alloc[32], s_res[32], s_unal[32], s_stuck[80];
  char s_lim[48] = "";
  size_t free_bytes = 0, total = d->total_memory;
  gca_status_t info = d->ops->mem_get_info(d->device, &free_bytes, &total);
  gca__tc_fold(d, 0); /* the thread caches' frees too (Note [Thread caches]) */
  size_t allocated = (size_t)d->stats.allocated_bytes[GCA_STAT_ALL].current;
  size_t reserved = (size_t)d->stats.reserved_bytes[GCA_STAT_ALL].current;
  size_t private_bytes = gca__mempools_reserved_locked(d);
  size_t stuck;
  bool counted = gca__segments_stuck_bytes(d, &stuck); /* under the lock: it walks the blocks */
  char s_priv[32];
  d->stats.num_ooms++;
  gca__history_event(GCA_HA_OOM, d->device, free_bytes, seg_size, stream);
  gca__history_alloc_failure(d->device, size, stream);
  observer_t obs[MAX_OBSERVERS];
  int nobs;
  int device = d->device;
  bool limited = d->set_fraction;
  size_t allowed = d->allowed_max;
  gca__dev_unlock(d);

  pthread_mutex_lock(&g_lock);
  nobs = g_nobservers;
  memcpy(obs, g_observers, sizeof(obs[0]) * (size_t)nobs);
  pthread_mutex_unlock(&g_lock);
  for (int i = 0; i < nobs; i++)
    obs[i].fn(device, size, allocated, free_bytes, obs[i].ctx);

  if (counted) {
    char t[32];
    snprintf(s_stuck, sizeof(s_stuck), "%s of it beside blocks in use",
             gca__format_size(stuck, t, sizeof(t)));
  } else {
    snprintf(s_stuck, sizeof(s_stuck), "beside blocks in use: not counted past %d blocks",
             GCA__STUCK_WALK_MAX);
  }
  if (limited) {
    char t[32];
    snprintf(s_lim, sizeof(s_lim), "; limit %s", gca__format_size(allowed, t, sizeof(t)));
  }
  gca__error(GCA_ERR_OUT_OF_MEMORY,
             "malloc: out of memory on device %d: tried to allocate %s (%zu bytes requested, "
             "segment of %zu bytes); device total %s, %s free%s; allocated %s, reserved %s, "
             "reserved but unallocated %s (%s), private pools %s%s",
             device, gca__format_size(size, s_req, sizeof(s_req)), size, seg_size,
             gca__format_size(total, s_tot, sizeof(s_tot)),
             gca__format_size(free_bytes, s_free, sizeof(s_free)),
             info == GCA_OK ? "" : " (mem_get_info failed)",
             gca__format_size(allocated, s_alloc, sizeof(s_alloc)),
             gca__format_size(reserved, s_res, sizeof(s_res)),
             gca__format_size(reserved - allocated, s_unal, sizeof(s_unal)), s_stuck,
             gca__format_size(private_bytes, s_priv, sizeof(s_priv)), s_lim);
}

/* Checks, before allocator state is made for it, that the caller's stream
 * handle names a live stream of d's device (NULL and the special handles
 * always do); one device call, on the miss path only. */
static gca_status_t stream_check(gca__devalloc_t *d, gca_stream_t handle) {
  int sdev = -1;
  if (handle == NULL || GCA_STREAM_IS_SPECIAL(handle))
    return GCA_OK;
  gca_status_t st = d->ops->stream_get_device(handle, &sdev);
  if (st == GCA_ERR_INVALID_HANDLE || st == GCA_ERR_INVALID_ARGUMENT)
    return gca__error(GCA_ERR_INVALID_HANDLE, "stream %p is not a live stream (%s)", (void *)handle,
                      gca_last_error());
  if (st != GCA_OK)
    return gca__error_prefix(st, "stream %p", (void *)handle);
  if (sdev != d->device)
    return gca__error(GCA_ERR_INVALID_HANDLE, "stream %p belongs to device %d, not device %d",
                      (void *)handle, sdev, d->device);
  return GCA_OK;
}

/* The best fit in pool with the thread caches settled (Note [Thread
 * caches]): when nothing fits, the stream's blocks cached there go back to
 * the tree and the search runs again; a block found gives its neighbours in
 * a cache's domain back before it is split. */
static gca__block_t *take_fit(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                              size_t rounded) {
  gca__block_t *b = gca__pool_take_fit(d, pool, stream, rounded);
  if (GCA_LIKELY(!d->tc_on) || pool->owner != NULL) /* off: the caches hold nothing */
    return b;
  if (b == NULL && gca__tc_flush_stream(d, pool, stream) != 0)
    b = gca__pool_take_fit(d, pool, stream, rounded);
  while (b != NULL && d->tc_held != 0 && gca__tc_clear_near(d, b))
    b = gca__pool_take_fit(d, pool, stream, rounded);
  return b;
}

/* malloc with d->lock held; returns with it released. `stream` is the key
 * (Note [Per-thread stream keys]), `handle` the caller's stream. */
static __attribute__((noinline)) gca_status_t dev_malloc_locked(gca__devalloc_t *d, void **out,
                                                                size_t size, gca_stream_t stream,
                                                                gca_stream_t handle) {
  gca_status_t st;
  gca__block_t *b = NULL;
  d->epoch++;         /* Note [Free cache epochs] */
  gca__fc_settled(d); /* Note [Lazy puts]: a fast entry point's lock ends here */
  gca__tc_note_thread(d);
  if (GCA_UNLIKELY(d->npending != 0 || d->ndeferred != 0))
    GCA_CHECK_GOTO(gca__pending_process(d), st, fail);
  GCA_CHECK_GOTO(gca__block_reserve(d), st, fail);
  size_t rounded = gca__round_request(d, size);
  gca__pool_t *pool = rounded <= GCA__SMALL_SIZE ? &d->small : &d->large;
  if (GCA_UNLIKELY(atomic_load_explicit(&d->routing, memory_order_relaxed) != 0)) {
    GCA_CHECK_GOTO(routed_pool(d, &pool, handle == GCA_STREAM_LEGACY ? NULL : handle, rounded), st,
                   fail);
    if (pool->owner != NULL && pool->owner->transition != NULL) {
      st = gca__error(GCA_ERR_INVALID_STATE,
                      "malloc: the pool %#" PRIx64 " this request is routed to is being %s; "
                      "try again after",
                      pool->owner->handle, pool->owner->transition);
      goto fail;
    }
    if (pool->owner != NULL && pool->owner->suspended) {
      st = gca__error(GCA_ERR_INVALID_STATE,
                      "malloc: the pool %#" PRIx64 " this request is routed to is suspended; "
                      "resume it first",
                      pool->owner->handle);
      goto fail;
    }
  }
  if (d->tc_on && pool->owner == NULL && gca__tc_mine(d->device) != NULL &&
      (b = gca__tc_take_locked(d, pool, stream, rounded, size)) != NULL)
    goto out;
  if (d->fc_count != 0 && pool->owner == NULL &&
      (b = gca__fc_take(d, pool, stream, rounded, size, false)) != NULL)
    goto out;
  if (d->rb_count != 0 && pool == &d->small && (b = gca__rb_take(d, stream, rounded, size)) != NULL)
    goto out; /* Note [Recycle bins] */
  /* a miss searches what PyTorch's rules would: its stream's frees merged */
  if (d->fc_count != 0 && pool->owner == NULL)
    gca__fcache_evict_slot(d, pool, stream);
  size_t seg_size = d->caching ? gca__alloc_segment_size(rounded) : rounded;
  if (GCA_UNLIKELY(pool->no_split))
    seg_size = gca__alloc_no_split_segment_size(rounded);
  if (GCA_LIKELY(d->caching))
    b = take_fit(d, pool, stream, rounded);
  if (b == NULL && d->rb_count != 0 && pool == &d->small) { /* bins never cost a segment */
    gca__rb_flush_stream(d, stream);
    b = take_fit(d, pool, stream, rounded);
  }
  if (b == NULL) {
    GCA_CHECK_GOTO(stream_check(d, handle), st, fail);
    st = gca__release_new_block(d, pool, stream, seg_size, rounded, &b);
    if (st == GCA_ERR_OUT_OF_MEMORY) {
      DEBUG_CHECK(d);
      oom_fail(d, size, seg_size, stream); /* unlocks */
      return GCA_ERR_OUT_OF_MEMORY;
    }
    if (st != GCA_OK)
      goto fail;
    pool = b->pool; /* a use_on_oom private pool may have served it */
  }
  st = gca__ptrmap_insert(&d->ptrs, b->addr, b);
  if (st != GCA_OK) {
    if (!b->in_tree) {
      b->gc_base = pool->free_calls;
      gca__tree_insert(pool, b);
    }
    goto fail;
  }
  GCA_CHECK_GOTO(gca__block_reserve(d), st, fail_unmap);
  gca__block_activate(d, b, rounded, size);
  gca__pf_note(d, b); /* Note [Free facts] */
  if (GCA_UNLIKELY(pool->owner != NULL))
    pool->owner->nactive++;
out:
  if (d->rb != NULL)
    d->rb->last = b; /* Note [Recycle bins] */
  gca__history_event(GCA_HA_ALLOC, d->device, b->addr, size, stream);
  DEBUG_CHECK(d);
  gca__dev_unlock(d);
  *out = (void *)(uintptr_t)b->addr;
  return GCA_OK;

fail_unmap:
  gca__ptrmap_take(&d->ptrs, b->addr);
  if (!b->in_tree) {
    b->gc_base = pool->free_calls;
    gca__tree_insert(pool, b);
  }
fail:
  gca__history_alloc_failure(d->device, size, stream);
  DEBUG_CHECK(d);
  gca__dev_unlock(d);
  return gca__error_prefix(st, "malloc of %zu bytes on device %d", size, d->device);
}

/* gca_malloc_device past its fast path: validation, then the lock. */
static __attribute__((noinline)) gca_status_t malloc_slow(int device, void **ptr, size_t size,
                                                          gca_stream_t stream) {
  gca__devalloc_t *d = NULL; /* set by devalloc_get on success */
  if (ptr == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "malloc: the output pointer is NULL");
  *ptr = NULL;
  if (size == 0)
    return GCA_OK;
  GCA_CHECK(devalloc_get("malloc", device, &d));
  if (GCA_UNLIKELY(size > GCA__MAX_REQUEST)) {
    gca__history_alloc_failure(device, size, stream);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "malloc: %zu bytes requested on device %d is more than any device holds",
                      size, device);
  }
  gca__dev_lock(d);
  return dev_malloc_locked(d, ptr, size, gca__stream_key(stream), stream);
}

/* A miss of the calling thread's cache (Note [Thread caches]): the free
 * cache for the sizes the thread caches do not take, else the locked path.
 * Six arguments, all in registers. */
static __attribute__((noinline)) gca_status_t malloc_tc_miss(gca__devalloc_t *d, void **ptr,
                                                             size_t size, gca_stream_t stream) {
  gca_stream_t key = gca__stream_key(stream);
  gca__block_t *b;
  if (!gca__mutex_trylock(&d->lock))
    return malloc_slow(d->device, ptr, size, stream);
  if (d->fc_count != 0 && gca__fc_quiet(d)) { /* sizes the thread caches do not take */
    size_t rounded = gca__round_request(d, size);
    gca__pool_t *pool = rounded <= GCA__SMALL_SIZE ? &d->small : &d->large;
    if ((b = gca__fc_take(d, pool, key, rounded, size, false)) != NULL) {
      DEBUG_CHECK(d);
      *ptr = (void *)(uintptr_t)b->addr;
      gca__dev_let_go(d);
      return GCA_OK;
    }
  }
  /* the locked request's first steps alone: the thread's own cache (its
   * lock-free take may not have looked), then a bin (Note [Recycle bins]) */
  if (d->rb_count != 0 && gca__fc_quiet(d)) {
    size_t rounded = gca__round_request(d, size);
    d->epoch++;         /* Note [Free cache epochs] */
    gca__fc_settled(d); /* Note [Lazy puts] */
    if ((d->tc_on && rounded <= GCA__SMALL_SIZE &&
         (b = gca__tc_take_locked(d, &d->small, key, rounded, size)) != NULL) ||
        (b = gca__rb_take(d, key, rounded, size)) != NULL) {
      d->rb->last = b; /* as dev_malloc_locked's */
      DEBUG_CHECK(d);
      *ptr = (void *)(uintptr_t)b->addr;
      gca__dev_let_go(d);
      return GCA_OK;
    }
  }
  *ptr = NULL;
  return dev_malloc_locked(d, ptr, size, key, stream);
}

/* A device with no thread cache of the calling thread: the free cache's
 * hit under an uncontended lock, else the locked path. */
static __attribute__((noinline)) gca_status_t malloc_fc_try(gca__devalloc_t *d, void **ptr,
                                                            size_t size, gca_stream_t stream) {
  gca_stream_t key = gca__stream_key(stream);
  if (!gca__mutex_trylock(&d->lock))
    return malloc_slow(d->device, ptr, size, stream);
  if (GCA_LIKELY(d->fc_count != 0 && !d->tc_count && gca__fc_quiet(d))) {
    size_t rounded = gca__round_request(d, size);
    gca__pool_t *pool = rounded <= GCA__SMALL_SIZE ? &d->small : &d->large;
    gca__block_t *b = gca__fc_take(d, pool, key, rounded, size, true);
    if (GCA_LIKELY(b != NULL)) {
      DEBUG_CHECK(d);
      *ptr = (void *)(uintptr_t)b->addr;
      gca__dev_let_go(d);
      return GCA_OK;
    }
  }
  /* a recycle bin's block (Note [Recycle bins]): no search, no split, no record */
  if (d->rb_count != 0 && gca__fc_quiet(d)) {
    gca__block_t *b = gca__rb_take(d, key, gca__round_request(d, size), size);
    if (b != NULL) {
      DEBUG_CHECK(d);
      *ptr = (void *)(uintptr_t)b->addr;
      gca__dev_let_go(d);
      return GCA_OK;
    }
  }
  *ptr = NULL;
  return dev_malloc_locked(d, ptr, size, key, stream);
}

#ifndef GCA_DEBUG_CHECKS
/* The recycle bins' leaf take (Note [Recycle bins]), tail-called by the
 * pair's leaf when it misses, inside that leaf's biased hold, which it lets
 * go: apart from the pair's leaf, so that it keeps its few registers. Two
 * forms, chosen by d->tc_count: the plain one owes its statistics, the
 * counted one tests the thread caches' headroom, and neither carries the
 * other's code (8% fewer instructions a churn operation, Note [Leaf hits]). */
static inline __attribute__((always_inline)) gca_status_t
malloc_rb_leaf(gca__devalloc_t *d, void **ptr, size_t size, gca_stream_t stream, bool counted) {
  gca__block_t *b = gca__rb_leaf_take(d, size, stream, counted);
  gca__mutex_exit_biased(&d->lock);
  if (GCA_LIKELY(b != NULL)) {
    *ptr = (void *)(uintptr_t)b->addr;
    return GCA_OK;
  }
  return malloc_fc_try(d, ptr, size, stream);
}
static __attribute__((noinline)) gca_status_t malloc_rb_counted(gca__devalloc_t *d, void **ptr,
                                                                size_t size, gca_stream_t stream) {
  return malloc_rb_leaf(d, ptr, size, stream, true);
}
static __attribute__((noinline)) gca_status_t malloc_rb_held(gca__devalloc_t *d, void **ptr,
                                                             size_t size, gca_stream_t stream) {
  if (GCA_UNLIKELY(d->tc_count))
    return malloc_rb_counted(d, ptr, size, stream);
  return malloc_rb_leaf(d, ptr, size, stream, false);
}
#endif

/* Note [Leaf hits]: the one-thread pair's path, for a thread that holds
 * the device lock by its bias (Note [Biased device lock]): the free cache's
 * hit of the owed put's block (gca__fc_leaf_take), and the thread cache's
 * streak (malloc_tc, the frees alike); the recycle bins' put and take
 * (malloc_rb_held, free_rb_held) behind the pair's, in the same hold (25
 * fewer instructions a churn operation than entering it again: 499 -> 474
 * at 10^6 live blocks). The bins' leaves also serve a
 * thread with no cache of the device while thread caches are on (its cache
 * parked, Note [Thread cache waste]): they count that free towards its next
 * probe (gca__tc_leaf_declines) and raise a statistic only where the
 * caches' headroom cannot carry it past its peak (gca__fc_stat_room), and
 * otherwise leave the operation to the full path. A leaf calls nothing: what it cannot
 * finish it leaves as it found it and tail-calls the full path, so it saves
 * no register. The free cache's two leaves are part of the entry points
 * (gca_malloc_device, gca_free): the one-thread pair then takes no jump but
 * its branches: 149 instructions instead of 157 (callgrind), and a loop of
 * 512 B pairs on the development VM ran faster in 7 of 8 runs alternating
 * with the leaves apart (median 19.7 -> 15.8 ns). The take then tests the
 * request's gca__round_key against the put's and the stream handle before
 * its key, and the bias's second look is one word (GCA__MUTEX_REVOKING):
 * 124 instructions a pair (7.2 -> 6.6 ns on the VM); with the thread
 * pointer as the lock's identity, g_single_d and no bounds test of the
 * calling thread's device, 116. The bins' leaves, in a plain and a counted
 * form, take 405 instructions a churn operation at 10^6 live blocks instead
 * of 436 and 341 an alternating 4 KiB / 12 KiB pair instead of 372. A
 * debug_checks build,
 * which counts the locks held and walks after every mutation, always takes
 * the full path. */
static inline __attribute__((always_inline)) gca_status_t
malloc_fc(gca__devalloc_t *d, void **ptr, size_t size, gca_stream_t stream) {
#ifndef GCA_DEBUG_CHECKS
  if (GCA_LIKELY(gca__mutex_enter_biased(&d->lock))) {
    gca__block_t *b = gca__fc_leaf_take(d, size, stream);
    if (GCA_LIKELY(b != NULL)) {
      gca__mutex_exit_biased(&d->lock);
      *ptr = (void *)(uintptr_t)b->addr;
      return GCA_OK;
    }
    return malloc_rb_held(d, ptr, size, stream); /* the bins', in the same hold */
  }
#endif
  return malloc_fc_try(d, ptr, size, stream);
}

/* The calling thread's cache first, without the device lock (Note [Thread
 * caches]): the hit calls nothing (a thread's first per-thread-stream
 * request misses) and a miss is a tail call, so the path saves few registers. */
static __attribute__((noinline)) gca_status_t malloc_tc_take(gca__devalloc_t *d, gca__tcache_t *tc,
                                                             void **ptr, size_t size,
                                                             gca_stream_t stream) {
  gca_stream_t key = gca__stream_key_nocall(stream);
  gca__block_t *b;
  if (GCA_LIKELY(size <= GCA__TC_MAX_SIZE && key != GCA_STREAM_PER_THREAD && gca__tc_open(d) &&
                 (b = gca__tc_take(d, tc, key, size)) != NULL)) {
    *ptr = (void *)(uintptr_t)b->addr;
    return GCA_OK;
  }
  return malloc_tc_miss(d, ptr, size, stream);
}

/* Note [Leaf hits]: the streak (Note [Thread cache streaks]) first. */
static __attribute__((noinline)) gca_status_t
malloc_tc(gca__devalloc_t *d, gca__tcache_t *tc, void **ptr, size_t size, gca_stream_t stream) {
  gca__block_t *b = gca__tc_leaf_take(d, tc, size, stream);
  if (GCA_LIKELY(b != NULL)) {
    *ptr = (void *)(uintptr_t)b->addr;
    return GCA_OK;
  }
  return malloc_tc_take(d, tc, ptr, size, stream);
}

/* The entry points dispatch by tail calls, with the free cache's leaf
 * inline (Note [Leaf hits]): they save no register. `device` is an index
 * of g_devs. */
static inline __attribute__((always_inline)) gca_status_t
malloc_entry(int device, void **ptr, size_t size, gca_stream_t stream) {
  gca__devalloc_t *d;
  if (GCA_LIKELY(ptr != NULL && size - 1 < GCA__MAX_REQUEST &&
                 (d = atomic_load_explicit(&g_devs[device], memory_order_acquire)) != NULL)) {
    gca__tcache_t *tc = gca__tc_mine(device);
    if (tc != NULL)
      return malloc_tc(d, tc, ptr, size, stream);
    return malloc_fc(d, ptr, size, stream);
  }
  return malloc_slow(device, ptr, size, stream);
}

GCA_API gca_status_t gca_malloc_device(int device, void **ptr, size_t size, gca_stream_t stream) {
  if (GCA_UNLIKELY((unsigned)device >= GCA__MAX_DEVICES))
    return malloc_slow(device, ptr, size, stream);
  return malloc_entry(device, ptr, size, stream);
}

/* The calling thread's device needs no bounds test: gca_set_device checked it. */
GCA_API gca_status_t gca_malloc(void **ptr, size_t size, gca_stream_t stream) {
  GCA_ASSERT_DEBUG((unsigned)t_device < GCA__MAX_DEVICES);
  return malloc_entry(t_device, ptr, size, stream);
}

/* ---- free, record_stream, pointer_info ---- */

gca__block_t *gca__lock_live(gca_devptr_t addr, gca__devalloc_t **out) {
  int dev = atomic_load_explicit(&g_single_dev, memory_order_relaxed);
  int first = dev, last = dev;
  if (dev < 0) {
    dev = gca__owner_device(addr);
    if (dev == -1)
      return NULL;
    first = last = dev;
    if (dev == GCA__OWNER_ANY) {
      first = 0;
      last = atomic_load(&g_ndevs) - 1;
    }
  }
  for (int i = first; i <= last; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    gca__block_t *b = gca__ptrmap_find(&d->ptrs, addr);
    /* a block of a thread cache's domain is looked at under the device lock
     * from here on: it leaves the domain, unless cached there (not live) */
    if (GCA_LIKELY(b != NULL && !b->cached && !b->binned &&
                   (b->tc == NULL || gca__tc_claim(d, b)))) {
      *out = d;
      return b;
    }
    gca__dev_unlock(d);
  }
  return NULL;
}

/* Frees the live block b at addr with d->lock held; returns with it released.
 * `cache`: the free may go into the free cache (false: the device wastes its
 * puts, Note [Free cache waste]). Inlined into the two below, so that the
 * plain free of a wasteful device tests nothing for the cache. */
static inline __attribute__((always_inline)) gca_status_t
free_locked_impl(gca__devalloc_t *d, gca__block_t *b, gca_devptr_t addr, int expected_dev,
                 bool cache) {
  gca_status_t st, st2;
  d->epoch++;         /* Note [Free cache epochs] */
  gca__fc_settled(d); /* Note [Lazy puts] */
  gca__tc_note_thread(d);
  if (GCA_UNLIKELY(expected_dev >= 0 && expected_dev != d->device)) {
    gca__dev_unlock(d);
    return gca__error(GCA_ERR_INVALID_POINTER,
                      "free: pointer 0x%" PRIx64 " belongs to device %d, not device %d", addr,
                      d->device, expected_dev);
  }
  if (GCA_UNLIKELY(b->tc != NULL) && !gca__tc_claim(d, b)) { /* cached in a thread cache */
    DEBUG_CHECK(d);
    gca__dev_unlock(d);
    return gca__bad_pointer("free", addr);
  }
  if (GCA_UNLIKELY(b->nuses != 0))
    GCA_CHECK(gca__free_wait_uses(&d, &b, addr));
  if (GCA_UNLIKELY(d->npending != 0 || d->ndeferred != 0)) {
    st = gca__pending_process(d);
    if (st != GCA_OK) {
      DEBUG_CHECK(d);
      gca__dev_unlock(d);
      return st;
    }
  }
  /* the calling thread's cache first, then a recycle bin before the free
   * cache, or after it for the last request's block (Note [Recycle bins]) */
  bool bins_first = gca__rb_first(d, b);
  if ((cache && gca__tc_try_enter(d, b)) || (bins_first && gca__rb_try_put(d, b)) ||
      (cache && gca__fcache_try_put(d, b)) || (!bins_first && gca__rb_try_put(d, b))) {
    DEBUG_CHECK(d);
    gca__dev_unlock(d);
    return GCA_OK;
  }
  gca__ptrmap_take(&d->ptrs, addr);
  int gone = -1;
  st = gca__free_request(d, b, &gone);
  /* A stream the block was recorded on was destroyed: its work still runs, so wait
   * for that device, with the lock let go (Note [No waits under the device lock]),
   * and free again without that use. The block stays live meanwhile. */
  for (int round = 0; st == GCA_ERR_INVALID_HANDLE && gone >= 0 && round < GCA__MAX_DEVICES;
       round++) {
    if (!gca__device_wait_enter()) { /* a capture runs: Note [Capture gate] (device.c) */
      st = gca__free_request_deferred(d, b, gone);
      break;
    }
    st2 = gca__ptrmap_insert(&d->ptrs, addr, b);
    GCA_ASSERT(st2 == GCA_OK);
    gca__dev_let_go(d);
    st = d->ops->ctx_synchronize(gone);
    gca__device_wait_leave();
    gca__dev_lock(d);
    if (st != GCA_OK)
      goto out;
    if (gca__ptrmap_find(&d->ptrs, addr) != b) { /* freed by another thread meanwhile */
      DEBUG_CHECK(d);
      gca__dev_unlock(d);
      return gca__bad_pointer("free", addr);
    }
    gca__ptrmap_take(&d->ptrs, addr);
    st = gca__free_request(d, b, &gone);
  }
  if (st != GCA_OK)
    goto fail;
  DEBUG_CHECK(d);
  gca__dev_unlock(d);
  return GCA_OK;

fail:
  st2 = gca__ptrmap_insert(&d->ptrs, addr, b);
  GCA_ASSERT(st2 == GCA_OK); /* room is left by the take */
out:
  DEBUG_CHECK(d);
  gca__dev_unlock(d);
  return st;
}

static __attribute__((noinline)) gca_status_t free_locked(gca__devalloc_t *d, gca__block_t *b,
                                                          gca_devptr_t addr, int expected_dev) {
  return free_locked_impl(d, b, addr, expected_dev, true);
}

static __attribute__((noinline)) gca_status_t free_plain(gca__devalloc_t *d, gca__block_t *b,
                                                         gca_devptr_t addr) {
  return free_locked_impl(d, b, addr, -1, false);
}

/* Frees `ptr`; expected_dev >= 0 also requires it to belong to that device. */
static __attribute__((noinline)) gca_status_t free_impl(void *ptr, int expected_dev) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  if (ptr == NULL)
    return GCA_OK;
  gca__devalloc_t *d;
  gca__block_t *b = gca__lock_live(addr, &d);
  if (GCA_UNLIKELY(b == NULL))
    return gca__bad_pointer("free", addr);
  return free_locked(d, b, addr, expected_dev);
}

/* gca_free's free cache put on a device with thread caches (d->lock held):
 * a block a thread cache may take goes the locked way, which enters it
 * there; else the put into its slot, with the caches' headroom counted (Note
 * [Thread caches]), or on a device that wastes its puts the plain free (Note
 * [Free cache waste]). */
static __attribute__((noinline)) gca_status_t free_fc_counted(gca__devalloc_t *d, gca__block_t *b,
                                                              gca_devptr_t addr) {
  gca__fc_settled(d); /* Note [Lazy puts] */
  /* the calling thread's cache takes no free now and the free cache none
   * either: the plain free, but for their probes (Note [Thread cache waste]) */
  if (gca__tc_wants(d, b) && GCA_UNLIKELY(gca__tc_skips(d)) &&
      (!d->fc_on || (gca__fc_wasteful(d) && !gca__fc_probe(d))))
    return free_plain(d, b, addr);
  if (!gca__tc_wants(d, b) && d->fc_on) {
    /* a device that wastes its puts: the plain free, but for a probe (Note [Free cache waste]) */
    if (GCA_UNLIKELY(gca__fc_wasteful(d)) && !gca__fc_probe(d))
      return free_plain(d, b, addr);
    /* a recycle bin first, as free_fc_try: the thread cache did not want it */
    if (gca__rb_first(d, b) && gca__fc_quiet(d) && gca__rb_try_put(d, b)) {
      DEBUG_CHECK(d);
      gca__dev_unlock(d);
      return GCA_OK;
    }
    gca__block_t **slot = gca__fc_slot(d, b->stream, b->pool);
    if (gca__fc_cacheable(d, b) && gca__fc_quiet(d) && gca__fc_fits(d, slot, b)) {
      gca__fc_put(d, slot, b, false);
      DEBUG_CHECK(d);
      gca__dev_unlock(d);
      return GCA_OK;
    }
  }
  return free_locked(d, b, addr, -1);
}

/* A free the calling thread's cache did not take back (Note [Thread
 * caches]): the locked path. */
static __attribute__((noinline)) gca_status_t free_tc_miss(gca__devalloc_t *d, void *ptr) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  if (gca__mutex_trylock(&d->lock)) {
    gca__ptrslot_t *e = gca__ptrmap_slot(&d->ptrs, addr);
    /* from the slot's facts when this thread's cache declines it unread */
    if (e != NULL && gca__pf_hold(d, e) && gca__rb_put_fast(d, e)) {
      DEBUG_CHECK(d);
      gca__dev_unlock(d);
      return GCA_OK;
    }
    gca__block_t *b = e != NULL ? e->val : NULL;
    if (GCA_LIKELY(b != NULL && !b->cached && !b->binned))
      return free_fc_counted(d, b, addr);
    gca__dev_unlock(d);
  }
  return free_impl(ptr, -1);
}

/* A device with no thread cache of the calling thread: the free cache's put
 * under an uncontended lock, else the locked path. */
static __attribute__((noinline)) gca_status_t free_fc_try(gca__devalloc_t *d, void *ptr) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  if (!gca__mutex_trylock(&d->lock))
    return free_impl(ptr, -1);
  /* the block of the pair before, put back as it was (Note [Lazy puts]) */
  if (GCA_LIKELY(!d->tc_on && gca__fc_reput(d, addr))) {
    DEBUG_CHECK(d);
    gca__dev_unlock(d);
    return GCA_OK;
  }
  gca__ptrslot_t *e = gca__ptrmap_slot(&d->ptrs, addr);
  /* a recycle bin's put from the slot's facts alone (Note [Free facts]) */
  if (GCA_LIKELY(e != NULL && gca__pf_hold(d, e)) && gca__rb_put_fast(d, e)) {
    DEBUG_CHECK(d);
    gca__dev_unlock(d);
    return GCA_OK;
  }
  gca__block_t *b = e != NULL ? e->val : NULL;
  if (GCA_LIKELY(b != NULL && !b->cached && !b->binned)) {
    /* a thread cache may take it, or the statistics count their headroom */
    if (GCA_UNLIKELY(d->tc_on))           /* then also tc_count, when caches exist */
      return free_fc_counted(d, b, addr); /* a tail call */
    /* a recycle bin first when they are on, but for the block the last
     * request got, which the free cache's pair path serves (Note [Recycle
     * bins]) */
    if (gca__rb_first(d, b) && gca__fc_quiet(d) && gca__rb_try_put(d, b)) {
      DEBUG_CHECK(d);
      gca__dev_unlock(d);
      return GCA_OK;
    }
    /* the free cache's put: a plain free into its slot (Note [Free cache]) */
    bool plain = !d->fc_on;
    if (GCA_LIKELY(d->fc_on)) {
      /* a device that wastes its puts: the plain free, but for a probe (Note [Free cache waste]) */
      plain = GCA_UNLIKELY(gca__fc_wasteful(d)) && !gca__fc_probe(d);
      gca__block_t **slot = gca__fc_slot(d, b->stream, b->pool);
      if (GCA_LIKELY(!plain && gca__fc_cacheable(d, b) && gca__fc_quiet(d) &&
                     gca__fc_fits(d, slot, b))) {
        gca__fc_put(d, slot, b, true);
        DEBUG_CHECK(d);
        gca__dev_unlock(d);
        return GCA_OK;
      }
    }
    return plain ? free_plain(d, b, addr) : free_locked(d, b, addr, -1);
  }
  gca__dev_unlock(d);
  return free_impl(ptr, -1);
}

#ifndef GCA_DEBUG_CHECKS
/* The recycle bins' leaf put from the slot's facts (Note [Free facts]),
 * in the pair's leaf's hold, in two forms, as malloc_rb_held. */
static inline __attribute__((always_inline)) gca_status_t free_rb_leaf(gca__devalloc_t *d,
                                                                       void *ptr, bool counted) {
  bool done = gca__rb_leaf_put(d, (gca_devptr_t)(uintptr_t)ptr, counted);
  gca__mutex_exit_biased(&d->lock);
  if (GCA_LIKELY(done))
    return GCA_OK;
  return free_fc_try(d, ptr);
}
static __attribute__((noinline)) gca_status_t free_rb_counted(gca__devalloc_t *d, void *ptr) {
  return free_rb_leaf(d, ptr, true);
}
static __attribute__((noinline)) gca_status_t free_rb_held(gca__devalloc_t *d, void *ptr) {
  if (GCA_UNLIKELY(d->tc_count))
    return free_rb_counted(d, ptr);
  return free_rb_leaf(d, ptr, false);
}
#endif

/* Note [Leaf hits]: the put of the pair's block back (gca__fc_leaf_put). */
static inline __attribute__((always_inline)) gca_status_t free_fc(gca__devalloc_t *d, void *ptr) {
#ifndef GCA_DEBUG_CHECKS
  if (GCA_LIKELY(gca__mutex_enter_biased(&d->lock))) {
    if (GCA_LIKELY(gca__fc_leaf_put(d, (gca_devptr_t)(uintptr_t)ptr))) {
      gca__mutex_exit_biased(&d->lock);
      return GCA_OK;
    }
    return free_rb_held(d, ptr); /* the bins', in the same hold */
  }
#endif
  return free_fc_try(d, ptr);
}

/* A block the calling thread's cache handed out goes back to it (Note
 * [Thread caches]): as malloc_tc, no call but the miss's tail call. */
static __attribute__((noinline)) gca_status_t free_tc_put(gca__devalloc_t *d, gca__tcache_t *tc,
                                                          void *ptr) {
  if (GCA_LIKELY(gca__tc_open(d) && gca__tc_put(d, tc, (gca_devptr_t)(uintptr_t)ptr)))
    return GCA_OK;
  return free_tc_miss(d, ptr);
}

/* Note [Leaf hits]: the streak's put first. */
static __attribute__((noinline)) gca_status_t free_tc(gca__devalloc_t *d, gca__tcache_t *tc,
                                                      void *ptr) {
  if (GCA_LIKELY(gca__tc_leaf_put(d, tc, (gca_devptr_t)(uintptr_t)ptr)))
    return GCA_OK;
  return free_tc_put(d, tc, ptr);
}

/* As gca_malloc_device, a dispatcher by tail calls. */
GCA_API gca_status_t gca_free(void *ptr) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  gca__devalloc_t *d = atomic_load_explicit(&g_single_d, memory_order_acquire);
  /* one device (the common case): its map is the only place to look */
  if (GCA_LIKELY(d != NULL && addr != 0)) {
    gca__tcache_t *tc = gca__tc_mine(d->device);
    if (tc != NULL)
      return free_tc(d, tc, ptr);
    return free_fc(d, ptr);
  }
  return free_impl(ptr, -1);
}

/* ---- devices, cache, limits ---- */

GCA_API gca_status_t gca_set_device(int device) {
  const gca_device_ops_t *ops = NULL;
  GCA_CHECK(check_device_index("set_device", device, &ops));
  if (!t_device_told || device != t_device) {
    gca_status_t st = ops->ctx_set_device(device);
    if (st != GCA_OK)
      return gca__error_prefix(st, "set_device");
    t_device_told = true;
  }
  t_device = device;
  return GCA_OK;
}

GCA_API gca_status_t gca_get_device(int *device) {
  if (device == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_device: the output pointer is NULL");
  *device = t_device;
  return GCA_OK;
}

GCA_API gca_status_t gca_empty_cache(void) {
  int n = atomic_load(&g_ndevs);
  for (int i = 0; i < n; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    gca_status_t st = gca__release_cached(d);
    /* the layout starts over, and so does the peak that bounds its moves (Note
     * [Moves within a bound]): the allocated peak so far no longer counts */
    d->live_hwm = d->stats.allocated_bytes[GCA_STAT_ALL].current;
    d->peak_stale = d->stats.allocated_bytes[GCA_STAT_ALL].peak;
    DEBUG_CHECK(d);
    gca__dev_unlock(d);
    if (st != GCA_OK)
      return gca__error_prefix(st, "empty_cache: device %d", i);
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_set_memory_fraction(int device, double fraction) {
  gca__devalloc_t *d = NULL; /* set by devalloc_get on success */
  if (!(fraction > 0.0 && fraction <= 1.0))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "set_memory_fraction: fraction %g is not in (0, 1]",
                      fraction);
  GCA_CHECK(devalloc_get("set_memory_fraction", device, &d));
  gca__dev_lock(d);
  d->set_fraction = true;
  d->allowed_max = (size_t)(fraction * (double)d->total_memory);
  gca__caches_update(d);
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_enable_peer_access(int device, int peer) {
  gca__devalloc_t *d = NULL; /* set by devalloc_get on success */
  GCA_CHECK(check_device_index("enable_peer_access", peer, NULL));
  if (peer == device) /* as cuCtxEnablePeerAccess with the current context */
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "enable_peer_access: device %d is not a peer of itself", device);
  GCA_CHECK(devalloc_get("enable_peer_access", device, &d));
  /* classic memory: peer's context gets device's (cudaDeviceEnablePeerAccess) */
  gca_status_t st = d->ops->ctx_enable_peer_access(peer, device);
  if (st != GCA_OK && st != GCA_ERR_INVALID_STATE) /* INVALID_STATE: already enabled */
    return gca__error_prefix(st, "enable_peer_access: device %d to device %d", peer, device);
  gca__dev_lock(d);
  st = gca__expand_add_peer(d, peer);
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_set_memory_limit(int device, uint64_t bytes) {
  gca__devalloc_t *d = NULL; /* set by devalloc_get on success */
  GCA_CHECK(devalloc_get("set_memory_limit", device, &d));
  gca__dev_lock(d);
  d->set_fraction = bytes != 0;
  d->allowed_max = bytes;
  gca__caches_update(d);
  gca__dev_unlock(d);
  return GCA_OK;
}

/* ---- settings ---- */

GCA_API gca_status_t gca_set_config(const char *conf) {
  gca_status_t st = GCA_OK;
  if (conf == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "set_config: the configuration string is NULL");
  pthread_mutex_lock(&g_lock);
  if (config_load_locked() != GCA_OK) {
    /* a bad environment setting must not stop the program from setting its own */
    GCA_LOG_WARN("set_config: ignoring the environment's settings: %s", gca_last_error());
    gca__config_defaults(&g_cfg);
    g_cfg_loaded = true;
  }
  gca_alloc_config_t cfg = g_cfg;
  GCA_CHECK_GOTO(gca__config_parse(conf, &cfg), st, out);
  g_cfg = cfg;
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    set_config_locked(d, &cfg);
    apply_limit_from_config(d);
    gca__caches_update(d);
    gca__dev_unlock(d);
  }
out:
  pthread_mutex_unlock(&g_lock);
  return st;
}

GCA_API gca_status_t gca_get_config(char *buf, size_t len) {
  gca_status_t st = GCA_OK;
  if (buf == NULL || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "get_config: no output buffer");
  pthread_mutex_lock(&g_lock);
  st = config_load_locked();
  if (st == GCA_OK)
    st = gca__config_format(&g_cfg, buf, len);
  pthread_mutex_unlock(&g_lock);
  return st;
}

void gca__allocator_get_config(struct gca_alloc_config *out) {
  pthread_mutex_lock(&g_lock);
  if (config_load_locked() != GCA_OK)
    gca__config_defaults(out);
  else
    *out = g_cfg;
  pthread_mutex_unlock(&g_lock);
}

GCA_API gca_status_t gca_set_caching(bool enabled) {
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&g_lock);
  st = config_load_locked();
  if (st == GCA_OK)
    g_caching = enabled;
  pthread_mutex_unlock(&g_lock);
  GCA_CHECK(st);
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    d->caching = enabled;
    gca__caches_update(d);
    if (!enabled)
      st = gca__release_cached(d);
    gca__dev_unlock(d);
    if (st != GCA_OK)
      return gca__error_prefix(st, "set_caching: device %d", i);
  }
  return GCA_OK;
}

/* ---- out of memory observers ---- */

GCA_API gca_status_t gca_register_oom_observer(gca_oom_observer_t fn, void *ctx) {
  gca_status_t st = GCA_OK;
  if (fn == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "register_oom_observer: the function is NULL");
  pthread_mutex_lock(&g_lock);
  if (g_nobservers == MAX_OBSERVERS)
    st = gca__error(GCA_ERR_INVALID_STATE, "register_oom_observer: all %d observer slots are taken",
                    MAX_OBSERVERS);
  else
    g_observers[g_nobservers++] = (observer_t){fn, ctx};
  pthread_mutex_unlock(&g_lock);
  return st;
}

/* ---- PyTorch pluggable allocator entry points ---- */

GCA_API void *gca_torch_malloc(ssize_t size, int device, gca_stream_t stream) {
  void *p = NULL;
  gca_status_t st;
  if (size < 0)
    st = gca__error(GCA_ERR_INVALID_ARGUMENT, "torch_malloc: negative size %zd", size);
  else
    st = gca_malloc_device(device, &p, (size_t)size, stream);
  if (st != GCA_OK) {
    GCA_LOG_ERR("%s", gca_last_error());
    return NULL;
  }
  return p;
}

GCA_API void gca_torch_free(void *ptr, ssize_t size, int device, gca_stream_t stream) {
  GCA_UNUSED(size);
  GCA_UNUSED(stream);
  if (free_impl(ptr, device) != GCA_OK)
    GCA_LOG_ERR("%s", gca_last_error());
}

/* ---- introspection support ---- */

int gca__allocator_device_count(void) {
  return atomic_load(&g_ndevs);
}

/* d is out of the registry: no other thread reaches it. Its lock is taken and
 * let go once (the other threads' last changes are seen), and the teardown,
 * which waits for events and frees memory, runs without it (Note [No waits
 * under the device lock]). */
static void devalloc_destroy(gca__devalloc_t *d) {
  gca__dev_lock(d);
  gca__dev_let_go(d);
  gca__tc_destroy_all(d); /* their blocks go with the segments below */
  gca__pending_destroy(d);
  gca__ptrmap_destroy(&d->ptrs);
  gca__mempools_destroy_locked(d);
  gca__pool_t *pools[2] = {&d->small, &d->large};
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments, *next; s != NULL; s = next) {
      next = s->next;
      gca__segment_destroy(d, s);
    }
    gca__tree_fini(pools[k]);
  }
  gca__rb_destroy(d);
  gca__slabs_destroy(d);
  pthread_cond_destroy(&d->rel_cv);
  pthread_mutex_destroy(&d->rel_mu);
  free(d);
}

void gca__allocator_reset(void) {
  pthread_mutex_lock(&g_lock);
  atomic_store(&g_single_d, NULL);
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    atomic_store(&g_devs[i], NULL);
    devalloc_destroy(d);
  }
  atomic_store(&g_single_dev, -1);
  atomic_store(&g_ndevs, 0);
  g_cfg_loaded = false;
  g_caching = true;
  g_nobservers = 0;
  const gca_device_ops_t *ops = gca__device();
  if (t_device_told && t_device != 0 && ops != NULL)
    GCA_CHECK_IGNORE(ops->ctx_set_device(0));
  t_device = 0;
  t_device_told = false;
  pthread_mutex_unlock(&g_lock);
}
