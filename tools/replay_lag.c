/* SPDX-License-Identifier: Apache-2.0 */
/* replay_lag.c - gca-replay --lag N: streams that run N events behind the
 * host, as an engine's GPU runs behind the host that queues its work.
 *
 * The one idea: every `step` events (N / 4, at least 1) a host function is
 * queued on the stream of the event just replayed that returns only once the
 * host has replayed N more events. A block freed on the stream is then still
 * "in use" by queued work for about N events, and anything in the allocator
 * that waits for the stream (a synchronize before unmapping a free range)
 * blocks the host until the stream catches up, which it cannot do while the
 * host is blocked. So a queued function that sees the host replay not one
 * event in a whole window of PATIENCE_NS gives up, counts a stall and
 * returns: each stall is a host blocked on its own stream (without the
 * limit, a deadlock); a host that is only slow moves on within the window.
 * At a pass's end every queued function is let go and the streams are
 * synchronized.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "replay_lag.h"
#include "util.h"

#define PATIENCE_NS 100000000ull /* 0.1 s: far above what one event takes in a replay */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Atomic uint64_t progress; /* events the host has replayed this pass; UINT64_MAX: let go */
  _Atomic uint64_t want;     /* the smallest progress a queued function waits for */
  _Atomic int64_t stalls;
  uint64_t n, step;
} lag = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, UINT64_MAX, 0, 0, 1};

static struct timespec deadline(void) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  uint64_t ns = (uint64_t)dl.tv_nsec + PATIENCE_NS;
  dl.tv_sec += (time_t)(ns / 1000000000ull);
  dl.tv_nsec = (long)(ns % 1000000000ull);
  return dl;
}

static void wait_for_host(void *arg) {
  uint64_t target = (uint64_t)(uintptr_t)arg;
  if (atomic_load(&lag.progress) >= target)
    return;
  struct timespec dl = deadline();
  uint64_t seen = atomic_load(&lag.progress);
  pthread_mutex_lock(&lag.mu);
  for (;;) {
    /* want before progress, as the host stores progress before it reads want */
    if (target < atomic_load(&lag.want))
      atomic_store(&lag.want, target);
    uint64_t now = atomic_load(&lag.progress);
    if (now >= target)
      break;
    if (pthread_cond_timedwait(&lag.cv, &lag.mu, &dl) != ETIMEDOUT)
      continue;
    now = atomic_load(&lag.progress);
    if (now >= target)
      break;
    if (now == seen) { /* not one event in a whole window: the host is blocked */
      atomic_fetch_add(&lag.stalls, 1);
      break;
    }
    seen = now; /* a slow host, not a blocked one: another window */
    dl = deadline();
  }
  pthread_mutex_unlock(&lag.mu);
}

static void wake(uint64_t progress) {
  atomic_store(&lag.progress, progress);
  if (progress < atomic_load_explicit(&lag.want, memory_order_relaxed))
    return;
  pthread_mutex_lock(&lag.mu);
  atomic_store(&lag.want, UINT64_MAX); /* those still short of theirs set it again */
  pthread_cond_broadcast(&lag.cv);
  pthread_mutex_unlock(&lag.mu);
}

void replay_lag_start(uint64_t n) {
  lag.n = n;
  lag.step = n / 4 ? n / 4 : 1;
  atomic_store(&lag.progress, 0);
}

gca_status_t replay_lag_after(uint64_t i, gca_stream_t stream) {
  wake(i + 1);
  if ((i + 1) % lag.step != 0)
    return GCA_OK;
  gca_status_t st = gca_launch_host_func(stream, wait_for_host, (void *)(uintptr_t)(i + 1 + lag.n));
  if (st != GCA_OK)
    return tool_error_gca(st, "replay: --lag: queueing the stream's wait");
  return GCA_OK;
}

gca_status_t replay_lag_drain(const gca_stream_t *streams, size_t nstreams) {
  wake(UINT64_MAX);
  for (size_t i = 0; i < nstreams; i++) {
    gca_status_t st = gca_stream_synchronize(streams[i]);
    if (st != GCA_OK)
      return tool_error_gca(st, "replay: --lag: synchronizing stream %zu", i);
  }
  return GCA_OK;
}

int64_t replay_lag_stalls(void) {
  return atomic_load(&lag.stalls);
}
