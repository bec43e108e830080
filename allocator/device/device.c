/* SPDX-License-Identifier: Apache-2.0 */
/* device.c - backend selection. GCA_DEVICE=cuda|sim|auto picks the operation
 * table once per process; auto tries cuda (a driver and at least one device)
 * and otherwise falls back to sim, saying so once on stderr. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "device.h"
#include "sim/sim.h"

_Atomic int gca__device_captures;
void (*_Atomic gca__stream_retire_hook)(gca_stream_t stream);

/* Note [Capture gate]. While a capture runs in global mode the driver refuses
 * every synchronize and query made by any thread, and invalidates the capture
 * for it; ctx_synchronize, in any mode (measured on an H200, driver 580). The
 * allocator makes such calls on its own account from any thread: releases
 * wait for a segment's stream or the device, pending frees query events, a
 * destroyed stream's memory waits for the device. It skips them while
 * gca__device_captures is not zero, but a check followed by a call leaves a
 * window in which another thread begins a capture, and the call then
 * invalidates it (gca-stress with stream churn and captures hit it within
 * seconds). So the two sides meet at a gate, with sequentially consistent
 * atomics (each writes its own counter, then reads the other's):
 *   - a call announces itself in `waiters`, then reads the capture count: if
 *     a capture runs or is beginning, it withdraws and is skipped; otherwise
 *     it is made and leaves;
 *   - a capture is counted first, then its thread waits until no call is
 *     inside the gate before the driver begins it.
 * At least one side sees the other, so no such call overlaps a capture begun
 * through gca. Calls inside the gate are short or wait only for queued work,
 * which never waits for a capture to begin, so the capture's wait ends.
 * A thread that sets its own capture mode to relaxed may synchronize a
 * stream, query an event, mem_free and mem_alloc during another thread's
 * global-mode capture without invalidating it, but never ctx_synchronize
 * (H200, driver 580; contract_capture's other_threads_calls_follow_the_captures_mode):
 * so a release's stream wait, a classic segment's mem_free and the segment
 * calls of a request run in relaxed mode (segment.c, release.c), and the
 * pending frees' queries do while a capture runs (pending.c); ctx_synchronize
 * keeps to the gate. */
static _Atomic int waiters;

bool gca__device_wait_enter(void) {
  atomic_fetch_add(&waiters, 1);
  if (atomic_load(&gca__device_captures) == 0)
    return true;
  atomic_fetch_sub(&waiters, 1);
  return false;
}

void gca__device_wait_leave(void) {
  atomic_fetch_sub(&waiters, 1);
}

void gca__capture_enter(void) {
  atomic_fetch_add(&gca__device_captures, 1);
  while (atomic_load(&waiters) != 0)
    sched_yield();
}

void gca__capture_abandon(void) {
  atomic_fetch_sub(&gca__device_captures, 1);
}

void gca__stream_retire(gca_stream_t stream) {
  void (*retire)(gca_stream_t) = atomic_load(&gca__stream_retire_hook);
  if (retire != NULL && stream != NULL && !GCA_STREAM_IS_SPECIAL(stream))
    retire(stream);
}

gca_status_t gca__stream_destroy_retired(const gca_device_ops_t *ops, gca_stream_t stream) {
  gca__stream_retire(stream);
  return ops->stream_destroy(stream);
}

static const char *op_names[GCA_OP_COUNT] = {
#define OP_NAME(name) #name,
    GCA_DEVICE_OP_MAP(OP_NAME)
#undef OP_NAME
};

static pthread_once_t select_once = PTHREAD_ONCE_INIT;
static const gca_device_ops_t *selected;
static const gca_device_ops_t *override_ops;
static gca_status_t select_status;
static char select_detail[512];

const char *gca__device_op_name(gca_dev_op_t op) {
  if ((int)op < 0 || op >= GCA_OP_COUNT)
    return "unknown_op";
  return op_names[op];
}

static gca_status_t try_backend(const gca_device_ops_t *ops) {
  gca_status_t st = ops->init();
  if (st != GCA_OK)
    return st;
  int n = 0;
  st = ops->device_count(&n);
  if (st != GCA_OK)
    return st;
  if (n <= 0)
    return gca__error(GCA_ERR_NO_DEVICE, "%s: the driver reports no device", ops->name);
  return GCA_OK;
}

static void select_backend(void) {
  const char *want = gca__getenv("GCA_DEVICE");
  if (!want || !*want)
    want = "auto";
  if (strcasecmp(want, "sim") == 0) {
    select_status = try_backend(gca__sim_ops());
    if (select_status == GCA_OK)
      selected = gca__sim_ops();
  } else if (strcasecmp(want, "cuda") == 0) {
    select_status = try_backend(gca__cuda_ops());
    if (select_status == GCA_OK)
      selected = gca__cuda_ops();
  } else if (strcasecmp(want, "auto") == 0) {
    select_status = try_backend(gca__cuda_ops());
    if (select_status == GCA_OK) {
      selected = gca__cuda_ops();
    } else {
      char why[512];
      snprintf(why, sizeof(why), "%s", gca_last_error());
      select_status = try_backend(gca__sim_ops());
      if (select_status == GCA_OK) {
        selected = gca__sim_ops();
        fprintf(stderr, "gca: no usable CUDA device (%s); using the sim backend\n", why);
      }
    }
  } else {
    select_status =
        gca__error(GCA_ERR_CONFIG, "GCA_DEVICE='%s' is not one of cuda, sim, auto", want);
  }
  if (select_status != GCA_OK)
    snprintf(select_detail, sizeof(select_detail), "%s", gca_last_error());
}

GCA_API gca_status_t gca_device_init(void) {
  if (override_ops)
    return GCA_OK;
  pthread_once(&select_once, select_backend);
  if (select_status != GCA_OK)
    return gca__error(select_status, "%s", select_detail);
  return GCA_OK;
}

const gca_device_ops_t *gca__device(void) {
  if (override_ops)
    return override_ops;
  return selected;
}

const gca_device_ops_t *gca__device_get(gca_status_t *st) {
  gca_status_t s = gca_device_init();
  if (st)
    *st = s;
  return s == GCA_OK ? gca__device() : NULL;
}

bool gca__device_virtual_clock(void) {
  return gca__sim_clock_virtual();
}
uint64_t gca__device_clock_now(void) {
  return gca__sim_clock_now();
}
void gca__device_clock_advance_to(uint64_t vt) {
  gca__sim_clock_advance_to(vt);
}

void gca__device_override(const gca_device_ops_t *ops) {
  override_ops = ops;
}

GCA_API const char *gca_device_backend_name(void) {
  const gca_device_ops_t *ops = gca__device();
  return ops ? ops->name : NULL;
}

GCA_API gca_status_t gca_device_count(int *count) {
  if (!count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "gca_device_count: count is NULL");
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return st;
  return ops->device_count(count);
}
