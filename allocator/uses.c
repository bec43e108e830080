/* SPDX-License-Identifier: Apache-2.0 */
/* uses.c - the public calls on one live block: record_stream (a use on
 * another stream, waited for by the block's free, Note [Stream-ordered
 * reuse]) and pointer_info; the waits a free makes for uses no event can
 * follow (gca__free_wait_uses); and for a pointer that is not one, its error
 * (gca__bad_pointer) and whether it lies in gca's memory all the same
 * (gca__allocator_owns). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"
#include "introspect.h"
#include "tcache.h"

/* The device is resolved now: a stream of another device gets its event
 * there at free time, and NULL means the legacy stream of the caller's
 * current device, wherever the free happens. */
GCA_API gca_status_t gca_record_stream(void *ptr, gca_stream_t stream) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  gca_status_t st = GCA_OK;
  gca__devalloc_t *d;
  gca_stream_t handle = stream;
  stream = gca__stream_key(handle); /* Note [Per-thread stream keys] */
  gca__block_t *b = gca__lock_live(addr, &d);
  if (b == NULL)
    return gca__bad_pointer("record_stream", addr);
  /* a non-NULL key names one stream: known ones need no device query */
  if (stream != NULL && stream == b->stream)
    goto out;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (stream != NULL && b->uses[i].stream == stream)
      goto out;
  int sdev;
  st = d->ops->stream_get_device(handle, &sdev);
  if (st != GCA_OK) {
    st = gca__error_prefix(st, "record_stream: 0x%" PRIx64 " on stream %p", addr, (void *)handle);
    goto out;
  }
  if (stream == NULL && b->stream == NULL && sdev == d->device)
    goto out;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (b->uses[i].stream == stream && b->uses[i].dev == sdev)
      goto out;
  if (b->nuses == b->cap_uses) {
    uint32_t ncap = b->cap_uses ? b->cap_uses * 2 : 4;
    gca__use_t *n = realloc(b->uses, ncap * sizeof(*n));
    if (n == NULL) {
      st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "record_stream: host out of memory recording a stream for 0x%" PRIx64, addr);
      goto out;
    }
    b->uses = n;
    b->cap_uses = ncap;
  }
  gca__uses_set(d, b, b->nuses + 1);
  b->uses[b->nuses - 1] = (gca__use_t){stream, sdev};
  gca__pf_forget(d, addr); /* a bin takes no block with uses (Note [Free facts]) */
out:
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_pointer_info(const void *ptr, size_t *block_size, int *device) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  gca__devalloc_t *d;
  gca__block_t *b = gca__lock_live(addr, &d);
  if (b == NULL)
    return gca__bad_pointer("pointer_info", addr);
  size_t size = b->size;
  int dev = d->device;
  gca__dev_unlock(d);
  if (block_size != NULL)
    *block_size = size;
  if (device != NULL)
    *device = dev;
  return GCA_OK;
}

/* The segment of d whose address range holds addr (an expandable segment's
 * whole reservation, mapped or not), or NULL; the caller holds d->lock. */
static gca__segment_t *segment_holding(gca__devalloc_t *d, gca_devptr_t addr) {
  for (gca__pool_t *pool = &d->small; pool != NULL; pool = gca__pool_next(d, pool))
    for (gca__segment_t *s = pool->segments; s != NULL; s = s->next)
      if (addr >= s->base && addr < s->base + (s->expandable ? s->reserved_size : s->size))
        return s;
  return NULL;
}

/* The device allocator whose segments hold addr, returned locked with the
 * segment in *seg and the device in *device; NULL when none does (each
 * device's lock taken in turn). */
static gca__devalloc_t *lock_holder(gca_devptr_t addr, gca__segment_t **seg, int *device) {
  int n = gca__allocator_device_count();
  for (int i = 0; i < n; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    if ((*seg = segment_holding(d, addr)) != NULL) {
      *device = i;
      return d;
    }
    gca__dev_unlock(d);
  }
  return NULL;
}

bool gca__allocator_owns(gca_devptr_t addr, int *device) {
  gca__segment_t *s;
  int i;
  gca__devalloc_t *d = lock_holder(addr, &s, &i);
  if (d == NULL)
    return false;
  gca__dev_unlock(d);
  if (device != NULL)
    *device = i;
  return true;
}

/* Why addr is not a live block's start, for op's error: it lies inside a
 * live block, is a freed block's start, lies in free memory, or in no
 * segment of gca's. */
gca_status_t gca__bad_pointer(const char *op, gca_devptr_t addr) {
  gca__segment_t *s;
  int i;
  gca__devalloc_t *d = lock_holder(addr, &s, &i);
  if (d != NULL) {
    gca__block_t *b = s->head;
    while (b->next != NULL && b->next->addr <= addr)
      b = b->next;
    gca_devptr_t start = b->addr;
    size_t size = b->size;
    bool live = b->allocated && (b->tc == NULL || gca__tc_live(b));
    gca__dev_unlock(d);
    if (live)
      return gca__error(GCA_ERR_INVALID_POINTER,
                        "%s: pointer 0x%" PRIx64 " is inside the live block at 0x%" PRIx64
                        " (%zu bytes) on device %d, not its start",
                        op, addr, start, size, i);
    if (start == addr)
      return gca__error(GCA_ERR_INVALID_POINTER,
                        "%s: pointer 0x%" PRIx64 " (device %d) is not live: already freed "
                        "(double free?)",
                        op, addr, i);
    return gca__error(GCA_ERR_INVALID_POINTER,
                      "%s: pointer 0x%" PRIx64 " (device %d) is not live: it lies inside "
                      "free memory at 0x%" PRIx64 " (already freed?)",
                      op, addr, i, start);
  }
  return gca__error(GCA_ERR_INVALID_POINTER,
                    "%s: pointer 0x%" PRIx64 " was not allocated by gca (or was already freed "
                    "and its memory returned)",
                    op, addr);
}

/* ---- the waits of a free ---- */

/* Whether key s is another thread's per-thread key (or GCA__STREAM_GONE). */
static inline bool foreign(gca_stream_t s) {
  return gca__stream_is_ptds(s) && s != gca__t_ptds_key;
}

/* The devices of b's uses on other threads' per-thread streams, as a mask. */
static uint64_t foreign_ptds_devices(const gca__block_t *b) {
  uint64_t mask = 0;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (foreign(b->uses[i].stream))
      mask |= (uint64_t)1 << b->uses[i].dev;
  return mask;
}

/* Note [Per-thread stream keys]: no handle reaches another thread's
 * per-thread stream, so a free of a block used on one waits for those
 * devices with d->lock released, then drops those uses (satisfied) under the
 * lock again. While a capture runs no device may be waited for (Note [Capture
 * gate], device.c): those uses are then counted as uses of a destroyed stream
 * (GCA__STREAM_GONE), whose free is deferred until the device can be waited
 * for (Note [Gone streams of deferred frees]). Returns with the lock held and
 * *bp the live block at addr, or with no lock held and a status. */
static gca_status_t free_wait_foreign(gca__devalloc_t **dp, gca__block_t **bp, gca_devptr_t addr,
                                      uint64_t mask) {
  gca__devalloc_t *d = *dp;
  const gca_device_ops_t *ops = d->ops;
  gca__block_t *b = *bp;
  if (!gca__device_wait_enter()) {
    for (uint32_t i = 0; i < b->nuses; i++)
      if (foreign(b->uses[i].stream))
        b->uses[i].stream = GCA__STREAM_GONE;
    return GCA_OK;
  }
  gca__dev_let_go(d);
  gca_status_t st = GCA_OK;
  int dev;
  for (dev = 0; dev < GCA__MAX_DEVICES && st == GCA_OK; dev++)
    if (mask & ((uint64_t)1 << dev))
      st = ops->ctx_synchronize(dev);
  gca__device_wait_leave();
  if (st != GCA_OK)
    return gca__error_prefix(st,
                             "free: 0x%" PRIx64 " waiting for device %d (another thread's "
                             "per-thread stream used it)",
                             addr, dev - 1);
  b = gca__lock_live(addr, dp);
  if (b == NULL)
    return gca__bad_pointer("free", addr);
  uint32_t w = 0;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (!foreign(b->uses[i].stream))
      b->uses[w++] = b->uses[i];
  gca__uses_set(d, b, w);
  *bp = b;
  return GCA_OK;
}

/* Caching off: a free waits for the streams that used the block before it
 * completes (PyTorch synchronizes them), with d->lock let go (Note [No waits
 * under the device lock]): the block stays live and in the pointer map
 * meanwhile, so other threads see an allocated block and may use the device
 * freely; a free of the same pointer meanwhile is the caller's race, found
 * when the block is looked up again. The uses waited for are then dropped;
 * any recorded since are left to events. Returns as free_wait_foreign. */
static gca_status_t free_wait_uses(gca__devalloc_t **dp, gca__block_t **bp, gca_devptr_t addr) {
  gca__devalloc_t *d = *dp;
  gca__block_t *b = *bp;
  uint32_t n = b->nuses;
  gca__use_t *uses = GCA_FAILPOINT("free_wait_uses") ? NULL : malloc(n * sizeof(*uses));
  if (uses == NULL) {
    gca__dev_unlock(d);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "free: 0x%" PRIx64 ": host out of memory", addr);
  }
  memcpy(uses, b->uses, n * sizeof(*uses));
  gca__dev_let_go(d);
  gca_status_t st = GCA_OK;
  gca_capture_mode_t mode;
  bool relaxed = gca__relax(d->ops, &mode); /* Note [Capture gate] (device.c) */
  for (uint32_t i = 0; i < n && st == GCA_OK; i++)
    if (uses[i].stream != GCA__STREAM_GONE) /* left to the free's own device wait */
      st = gca__use_wait(d, &uses[i]);
  gca__unrelax(d->ops, relaxed, mode);
  if (st != GCA_OK) {
    free(uses);
    return gca__error_prefix(st, "free: 0x%" PRIx64, addr);
  }
  b = gca__lock_live(addr, dp);
  if (b == NULL) {
    free(uses);
    return gca__bad_pointer("free", addr);
  }
  uint32_t w = 0;
  for (uint32_t i = 0; i < b->nuses; i++) {
    bool waited = false;
    for (uint32_t k = 0; k < n && !waited; k++)
      waited = b->uses[i].stream == uses[k].stream && b->uses[i].dev == uses[k].dev &&
               uses[k].stream != GCA__STREAM_GONE;
    if (!waited)
      b->uses[w++] = b->uses[i];
  }
  gca__uses_set(d, b, w);
  free(uses);
  *bp = b;
  return GCA_OK;
}

gca_status_t gca__free_wait_uses(gca__devalloc_t **dp, gca__block_t **bp, gca_devptr_t addr) {
  uint64_t mask = foreign_ptds_devices(*bp);
  if (mask != 0)
    GCA_CHECK(free_wait_foreign(dp, bp, addr, mask));
  if (!(*dp)->caching && (*bp)->nuses != 0)
    GCA_CHECK(free_wait_uses(dp, bp, addr));
  return GCA_OK;
}
