/* SPDX-License-Identifier: Apache-2.0 */
/* streamkey.c - the allocator's key for a stream handle, and the way back
 * from a key to the device (Note [Per-thread stream keys]).
 *
 * Note [Per-thread stream keys]. Blocks, segments, free-cache slots and
 * recorded uses are keyed by stream (Note [Stream-ordered reuse]). A handle
 * names one stream for every thread except GCA_STREAM_PER_THREAD, which names
 * the calling thread's own default stream (Note [Special streams]), so it
 * cannot be a key: a block freed by one thread would look reusable at once on
 * another thread's stream. gca__stream_key gives each thread a key of its own
 * for it, a value no stream handle has (GCA__PTDS_TAG, a non-canonical
 * address, with a serial number from a process counter, never reused), and maps
 * GCA_STREAM_LEGACY to NULL, its equal. Going back, the calling thread's own
 * key is GCA_STREAM_PER_THREAD again (with the allocator's device current);
 * another thread's key reaches no stream from here, so what would wait for
 * that stream waits for the whole device instead (ctx_synchronize): a free of
 * a block used on another thread's per-thread stream, or a release of a
 * segment keyed by it. The free waits with the device lock released
 * (allocator.c); the release paths wait where they would wait for the
 * stream. A thread that exits leaves its key's cached blocks to empty_cache.
 */
#include <stdatomic.h>

#include "alloc_core.h"

_Thread_local gca_stream_t gca__t_ptds_key __attribute__((tls_model("initial-exec")));
static atomic_uintptr_t next_key = 1;

gca_stream_t gca__ptds_key_slow(void) {
  uintptr_t id = atomic_fetch_add_explicit(&next_key, 1, memory_order_relaxed);
  gca__t_ptds_key = (gca_stream_t)(GCA__PTDS_TAG | id);
  return gca__t_ptds_key;
}

gca_status_t gca__stream_op(gca__devalloc_t *d, int dev, gca_stream_t s, gca_event_t ev) {
  gca_stream_t h = s;
  if (!gca__stream_is_ptds(s))
    return ev != NULL ? d->ops->event_record(ev, h) : d->ops->stream_synchronize(h);
  if (s == gca__t_ptds_key) {
    h = GCA_STREAM_PER_THREAD;
  } else {
    GCA_CHECK(d->ops->ctx_synchronize(dev));
    if (ev == NULL)
      return GCA_OK;
    h = NULL;
  }
  int cur = dev;
  GCA_CHECK(d->ops->ctx_get_device(&cur));
  if (cur != dev)
    GCA_CHECK(d->ops->ctx_set_device(dev));
  gca_status_t st = ev != NULL ? d->ops->event_record(ev, h) : d->ops->stream_synchronize(h);
  if (cur != dev) {
    gca_status_t rst = d->ops->ctx_set_device(cur);
    if (st == GCA_OK)
      st = rst;
  }
  return st;
}

gca_status_t gca__stream_synchronize(gca__devalloc_t *d, gca_stream_t s) {
  return gca__stream_op(d, d->device, s, NULL);
}
