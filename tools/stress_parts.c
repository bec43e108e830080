/* SPDX-License-Identifier: Apache-2.0 */
/* stress_parts.c - gca-stress's episodes beyond allocate and free: capture and
 * replay into a private pool (with checkpoint and restore), IPC export and
 * import of a live block, suspend and resume of a private pool, a graph tree
 * (warm-up, record, replay, exec update, with the graph-safe RNG), and a round
 * of the remaining device API calls.
 *
 * The one idea: an episode checks what it computed and always winds down the
 * same way, in reverse order of creation, whichever step an injected fault
 * stopped it at; what cannot be freed now (a free or a close that failed) is
 * kept and retried once the run's faults are cleared, so the end-of-run leak
 * check still holds.
 */
#include "stress_parts.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RETRIES        3
#define SETTLE_RETRIES 64

static bool part_fail(stress_part_ctx_t *ctx, const char *fmt, ...) TOOL_PRINTF(2, 3);

static bool part_fail(stress_part_ctx_t *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->fail, sizeof(ctx->fail), fmt, ap);
  va_end(ap);
  return false;
}

/* A step of an episode failed: counted in *aborted while faults are injected
 * or when the device is full (the episode winds down, as a plain malloc's OOM
 * is counted; a capture cannot release cached memory), else a failure of the
 * run. */
static bool step_failed(stress_part_ctx_t *ctx, const char *what, gca_status_t st,
                        uint64_t *aborted) {
  if (ctx->faults || st == GCA_ERR_OUT_OF_MEMORY) {
    (*aborted)++;
    return true;
  }
  return part_fail(ctx, "%s failed: %s: %s", what, gca_status_name(st), gca_last_error());
}

static bool push(void ***v, size_t *n, size_t *cap, void *p) {
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 8;
    void **grown = realloc(*v, ncap * sizeof(*grown));
    if (!grown)
      return false;
    *v = grown;
    *cap = ncap;
  }
  (*v)[(*n)++] = p;
  return true;
}

/* Frees a block, retrying; one that still fails is freed after the run. */
static bool release(stress_part_ctx_t *ctx, void *p) {
  if (!p)
    return true;
  gca_status_t st = GCA_OK;
  for (int i = 0; i < RETRIES; i++)
    if ((st = gca_free(p)) == GCA_OK)
      return true;
  if (!ctx->faults)
    return part_fail(ctx, "gca_free(%p) failed: %s: %s", p, gca_status_name(st), gca_last_error());
  ctx->c->deferred++;
  if (!push(&ctx->deferred, &ctx->ndeferred, &ctx->capdeferred, p))
    return part_fail(ctx, "out of host memory deferring a free");
  return true;
}

static bool close_import(stress_part_ctx_t *ctx, void *q) {
  if (!q)
    return true;
  gca_status_t st = GCA_OK;
  for (int i = 0; i < RETRIES; i++) {
    if ((st = gca_ipc_close(q)) == GCA_OK)
      return true;
    /* Note [Close is not retried]: a close that failed after unmapping
     * ("was unmapped, but ...") has already forgotten the import; what it
     * could not release is beyond the caller's reach. */
    if (i > 0 && st == GCA_ERR_INVALID_POINTER && ctx->faults) {
      ctx->c->ipc_close_dropped++;
      return true;
    }
  }
  if (!ctx->faults)
    return part_fail(ctx, "gca_ipc_close(%p) failed: %s: %s", q, gca_status_name(st),
                     gca_last_error());
  ctx->c->deferred++;
  if (!push(&ctx->unclosed, &ctx->nunclosed, &ctx->capunclosed, q))
    return part_fail(ctx, "out of host memory deferring a close");
  return true;
}

/* Waits for a stream even through injected synchronize failures, so nothing
 * queued on it still writes into host memory the caller is about to reuse. */
static void settle(gca_stream_t s) {
  if (!s)
    return;
  for (int i = 0; i < SETTLE_RETRIES; i++)
    if (gca_stream_synchronize(s) == GCA_OK)
      return;
  for (int i = 0; i < SETTLE_RETRIES; i++)
    if (gca_device_synchronize() == GCA_OK)
      return;
}

#define RETRY(call)                                  \
  do {                                               \
    for (int retry_ = 0; retry_ < RETRIES; retry_++) \
      if ((call) == GCA_OK)                          \
        break;                                       \
  } while (0)

/* Runs `call` as a step of the episode: on failure, `what` names it and the
 * episode jumps to its `failed` label. */
#define STEP(name, call)         \
  do {                           \
    what = (name);               \
    if ((st = (call)) != GCA_OK) \
      goto failed;               \
  } while (0)

/* ---- capture, replay, checkpoint and restore ---- */

/* Replays the graph once and checks c[i] == value + i * step for i < n. */
static gca_status_t replay_and_check(stress_part_ctx_t *ctx, gca_graph_exec_t x, gca_stream_t s,
                                     void *c, uint32_t *host, size_t n, uint32_t value,
                                     uint32_t step, const char **what, bool *ok) {
  *what = "gca_memset_d32_async (clearing the result)";
  TOOL_CHECK(gca_memset_d32_async(c, 0, n, s));
  *what = "gca_graph_launch";
  TOOL_CHECK(gca_graph_launch(x, s));
  *what = "gca_memcpy_async (reading the result)";
  TOOL_CHECK(gca_memcpy_async(host, c, n * 4, s));
  *what = "gca_stream_synchronize";
  gca_status_t st = gca_stream_synchronize(s);
  if (st != GCA_OK) {
    settle(s);
    return st;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t want = value + (uint32_t)i * step;
    if (host[i] != want) {
      *ok = part_fail(ctx,
                      "CORRUPTION in a graph replay: the captured result at %p (%zu words) has "
                      "word %zu = 0x%08x, expected 0x%08x",
                      c, n, i, host[i], want);
      return GCA_OK;
    }
  }
  return GCA_OK;
}

static bool part_capture(stress_part_ctx_t *ctx) {
  stress_rng_t *rng = ctx->rng;
  size_t n = 64 + (size_t)gca__stress_rng_below(rng, 4033);
  uint32_t va = (uint32_t)gca__stress_rng_next(rng), sa = (uint32_t)gca__stress_rng_next(rng);
  uint32_t vb = (uint32_t)gca__stress_rng_next(rng), sb = (uint32_t)gca__stress_rng_next(rng);
  int replays = 1 + (int)gca__stress_rng_below(rng, 3);
  bool restore = gca__stress_rng_below(rng, 2) == 0;
  gca_pool_t *pool = NULL;
  gca_stream_t s = ctx->stream;
  gca_graph_t g = NULL;
  gca_graph_exec_t x = NULL;
  gca_pool_state_t *state = NULL;
  gca_pool_changes_t changes = {0};
  void *a = NULL, *b = NULL, *c = NULL;
  bool capturing = false, routed = false, ok = true;
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  const char *what = "";
  gca_status_t st;
  uint32_t *host = malloc(n * 4);
  if (!host)
    return part_fail(ctx, "out of host memory for a capture's result");

  STEP("gca_pool_create", gca_pool_create(0, NULL, &pool));
  STEP("gca_stream_begin_capture", gca_stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  capturing = true;
  STEP("gca_pool_begin_capture", gca_pool_begin_capture(pool, s));
  routed = true;
  STEP("gca_malloc (captured)", gca_malloc(&a, n * 4, s));
  STEP("gca_malloc (captured)", gca_malloc(&b, n * 4, s));
  STEP("gca_kernel_fill_u32 (captured)", gca_kernel_fill_u32(a, va, sa, n, s));
  STEP("gca_kernel_fill_u32 (captured)", gca_kernel_fill_u32(b, vb, sb, n, s));
  STEP("gca_malloc (captured)", gca_malloc(&c, n * 4, s));
  STEP("gca_kernel_add_u32 (captured)", gca_kernel_add_u32(c, a, b, n, s));
  STEP("gca_free (captured)", gca_free(a));
  a = NULL;
  STEP("gca_free (captured)", gca_free(b));
  b = NULL;
  STEP("gca_stream_capture_status", gca_stream_capture_status(s, &cs));
  if (cs != GCA_CAPTURE_STATUS_ACTIVE) {
    ok = part_fail(ctx, "capture status %d during a capture, expected active", (int)cs);
    goto out;
  }
  STEP("gca_stream_end_capture", gca_stream_end_capture(s, &g));
  capturing = false;
  routed = false;
  STEP("gca_pool_end_capture", gca_pool_end_capture(pool, s));
  STEP("gca_graph_instantiate", gca_graph_instantiate(&x, g));
  ctx->c->captures++;
  for (int r = 0; r < replays && ok; r++) {
    STEP(what, replay_and_check(ctx, x, s, c, host, n, va + vb, sa + sb, &what, &ok));
    ctx->c->replays_checked += ok;
  }
  if (!ok || !restore)
    goto out;
  /* the pool's layout with c live; c freed; restored: c is live again at the
   * same address, the graph writes it as before */
  STEP("gca_pool_checkpoint", gca_pool_checkpoint(pool, &state));
  STEP("gca_free", gca_free(c));
  void *freed = c;
  c = NULL;
  st = gca_pool_restore(pool, state, &changes);
  if (st != GCA_OK) {
    size_t bs;
    int dev;
    if (gca_pointer_info(freed, &bs, &dev) == GCA_OK)
      c = freed; /* live again despite the failure: freed below */
    what = "gca_pool_restore";
    goto failed;
  }
  c = freed;
  if (changes.nallocated != 1 || changes.allocated[0] != c || changes.nfreed != 0) {
    ok = part_fail(ctx,
                   "gca_pool_restore of a pool whose one live block %p was freed after the "
                   "checkpoint reported %zu allocated (first %p) and %zu freed, expected that "
                   "block alone allocated",
                   c, changes.nallocated, changes.nallocated ? changes.allocated[0] : NULL,
                   changes.nfreed);
    goto out;
  }
  STEP(what, replay_and_check(ctx, x, s, c, host, n, va + vb, sa + sb, &what, &ok));
  ctx->c->restores_checked += ok;
  goto out;

failed:
  ok = step_failed(ctx, what, st, &ctx->c->capture_aborted);
out:
  /* a failed end of capture may leave the stream capturing */
  for (int i = 0; capturing && i < RETRIES; i++) {
    gca_graph_t g2 = NULL;
    if (gca_stream_end_capture(s, &g2) == GCA_OK) {
      capturing = false;
      if (g2)
        RETRY(gca_graph_destroy(g2));
    } else if (gca_stream_capture_status(s, &cs) == GCA_OK && cs == GCA_CAPTURE_STATUS_NONE) {
      capturing = false;
    }
  }
  if (routed)
    RETRY(gca_pool_end_capture(pool, s));
  settle(s);
  ok = release(ctx, a) && ok;
  ok = release(ctx, b) && ok;
  ok = release(ctx, c) && ok;
  if (x)
    RETRY(gca_graph_exec_destroy(x));
  if (g)
    RETRY(gca_graph_destroy(g));
  gca_pool_changes_free(&changes);
  gca_pool_state_free(state);
  if (pool)
    RETRY(gca_pool_release(pool));
  free(host);
  return ok;
}

/* ---- IPC ---- */

bool gca__stress_part_ipc(stress_part_ctx_t *ctx, gca_devptr_t ptr, const stress_stamp_t *stamp,
                          gca_stream_t stream) {
  gca_ipc_handle_t *h = NULL, *h2 = NULL;
  int sv[2] = {-1, -1};
  void *q = NULL;
  bool ok = true;
  /* every other export asks for fabric handles; a device without them
   * refuses (GCA_SIM_FABRIC=1 turns them on in the sim) and the export falls
   * back to file descriptors */
  bool fabric = gca__stress_rng_below(ctx->rng, 2) == 0;
  const char *what = fabric ? "gca_ipc_export_ex (fabric)" : "gca_ipc_export";
  gca_status_t st = fabric ? gca_ipc_export_ex((void *)(uintptr_t)ptr, GCA_IPC_FABRIC, &h)
                           : gca_ipc_export((void *)(uintptr_t)ptr, &h);
  if (st == GCA_ERR_NOT_SUPPORTED && fabric &&
      strstr(gca_last_error(), "does not support fabric handles")) {
    ctx->c->ipc_fabric_not_supported++;
    what = "gca_ipc_export";
    st = gca_ipc_export((void *)(uintptr_t)ptr, &h);
    fabric = false;
  }
  if (st == GCA_ERR_NOT_SUPPORTED) { /* a cuMemAlloc segment: neither expandable nor ipc_handles */
    ctx->c->ipc_not_supported++;
    return true;
  }
  if (st != GCA_OK)
    goto failed;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    ok = part_fail(ctx, "socketpair for an IPC handle failed");
    goto out;
  }
  STEP("gca_ipc_send", gca_ipc_send(sv[0], h));
  STEP("gca_ipc_recv", gca_ipc_recv(sv[1], &h2));
  STEP("gca_ipc_open", gca_ipc_open(h2, 0, &q));
  STEP("reading the stamp through the import",
       gca__stress_stamp_read((gca_devptr_t)(uintptr_t)q, stamp, ctx->scratch, stream));
  stress_mismatch_t mm;
  if (!gca__stress_stamp_check(stamp, ctx->scratch, &mm)) {
    ok = part_fail(ctx,
                   "CORRUPTION through an IPC import of the block at 0x%" PRIx64
                   " (imported at %p): offset %" PRIu64 " expected 0x%08x found 0x%08x",
                   ptr, q, mm.offset, mm.expected, mm.found);
    goto out;
  }
  ctx->c->ipc_checked++;
  ctx->c->ipc_fabric_checked += fabric;
  goto out;

failed:
  ok = step_failed(ctx, what, st, &ctx->c->ipc_aborted);
out:
  ok = close_import(ctx, q) && ok;
  gca_ipc_handle_free(h2);
  gca_ipc_handle_free(h);
  if (sv[0] >= 0)
    close(sv[0]);
  if (sv[1] >= 0)
    close(sv[1]);
  return ok;
}

/* ---- suspend and resume ---- */

#define SUSPEND_BLOCKS 3

static bool part_suspend(stress_part_ctx_t *ctx) {
  stress_rng_t *rng = ctx->rng;
  int nblocks = 1 + (int)gca__stress_rng_below(rng, SUSPEND_BLOCKS);
  void *p[SUSPEND_BLOCKS] = {0};
  stress_stamp_t stamp[SUSPEND_BLOCKS];
  gca_pool_t *pool = NULL;
  gca_stream_t s = ctx->stream;
  bool scoped = false, ok = true, readable = true, suspended = false;
  const char *what = "";
  gca_status_t st;

  STEP("gca_pool_create", gca_pool_create(0, NULL, &pool));
  STEP("gca_pool_use_begin", gca_pool_use_begin(pool));
  scoped = true;
  for (int i = 0; i < nblocks; i++) {
    uint64_t size = 4096 + gca__stress_rng_below(rng, 4u << 20);
    STEP("gca_malloc (in the pool)", gca_malloc(&p[i], size, s));
    gca__stress_stamp_layout(size, gca__stress_mix(ctx->key, gca__stress_rng_next(rng)), &stamp[i]);
    STEP("stamping a pool block", gca__stress_stamp_write((gca_devptr_t)(uintptr_t)p[i], &stamp[i],
                                                          0, stamp[i].nregions, s));
  }
  scoped = false;
  STEP("gca_pool_use_end", gca_pool_use_end(pool));
  st = gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE);
  if (st == GCA_ERR_NOT_SUPPORTED ||
      (st == GCA_ERR_INVALID_STATE && strstr(gca_last_error(), "capture"))) {
    ctx->c->suspend_refused++; /* classic segments, or another thread's capture */
  } else if (st != GCA_OK) {
    what = "gca_pool_suspend";
    goto failed;
  } else {
    readable = false;
    suspended = true;
    for (int i = 0; i < RETRIES && !readable; i++)
      readable = (st = gca_pool_resume(pool)) == GCA_OK;
    if (!readable) {
      what = "gca_pool_resume";
      goto failed;
    }
  }
  for (int i = 0; i < nblocks; i++) {
    STEP("reading a pool block's stamp back",
         gca__stress_stamp_read((gca_devptr_t)(uintptr_t)p[i], &stamp[i], ctx->scratch, s));
    stress_mismatch_t mm;
    if (!gca__stress_stamp_check(&stamp[i], ctx->scratch, &mm)) {
      ok = part_fail(ctx,
                     "CORRUPTION in a private pool's block at %p after %s: offset %" PRIu64
                     " expected 0x%08x found 0x%08x",
                     p[i], suspended ? "suspend and resume" : "a refused suspend", mm.offset,
                     mm.expected, mm.found);
      goto out;
    }
  }
  ctx->c->suspends_checked += suspended;
  goto out;

failed:
  ok = step_failed(ctx, what, st, &ctx->c->suspend_aborted);
out:
  if (scoped)
    RETRY(gca_pool_use_end(pool));
  if (readable)
    settle(s);
  for (int i = 0; i < nblocks; i++)
    ok = release(ctx, p[i]) && ok;
  if (pool)
    RETRY(gca_pool_release(pool));
  return ok;
}

/* ---- graph trees ---- */

#define TREE_STEPS_MIN 5
#define TREE_MOVE_AT   3 /* the step whose static input moves (an exec update) */
#define TREE_WORDS_MAX 4096

/* The function run through the tree: y = the generator's next n numbers + x. */
typedef struct tree_fn_ctx {
  gca_graph_rng_t *rng;
  size_t n;
} tree_fn_ctx_t;

static gca_status_t tree_body(gca_stream_t s, void *const *in, void *const *out, void *arg) {
  const tree_fn_ctx_t *f = arg;
  gca_status_t st = gca_graph_rng_uniform_u32(f->rng, out[0], f->n, s);
  if (st == GCA_OK)
    st = gca_kernel_add_u32(out[0], out[0], in[0], f->n, s);
  return st;
}

/* One step: runs the function on x and checks its output against the same
 * draws made eagerly by a second generator set to the first one's state. */
static gca_status_t tree_step_check(stress_part_ctx_t *ctx, gca_graph_tree_t *t, gca_graph_fn_t *fn,
                                    gca_graph_rng_t *rng, gca_graph_rng_t *ref, void *x, void *r,
                                    size_t n, uint32_t *got, uint32_t *want, const char **what,
                                    bool *ok) {
  gca_stream_t ts = NULL;
  uint64_t seed = 0, offset = 0;
  void *out[1] = {NULL};
  *what = "gca_graph_tree_stream";
  TOOL_CHECK(gca_graph_tree_stream(t, &ts));
  *what = "gca_graph_rng_get_state";
  TOOL_CHECK(gca_graph_rng_get_state(rng, &seed, &offset));
  *what = "gca_graph_tree_run";
  TOOL_CHECK(gca_graph_tree_run(t, fn, &x, 1, out, 1));
  *what = "gca_graph_rng_set_state (the reference generator)";
  TOOL_CHECK(gca_graph_rng_set_state(ref, seed, offset));
  *what = "gca_graph_rng_uniform_u32 (the reference draws)";
  TOOL_CHECK(gca_graph_rng_uniform_u32(ref, r, n, ts));
  *what = "gca_kernel_add_u32 (the reference)";
  TOOL_CHECK(gca_kernel_add_u32(r, r, x, n, ts));
  *what = "gca_memcpy_async (reading the output)";
  TOOL_CHECK(gca_memcpy_async(got, out[0], n * 4, ts));
  *what = "gca_memcpy_async (reading the reference)";
  TOOL_CHECK(gca_memcpy_async(want, r, n * 4, ts));
  *what = "gca_stream_synchronize (the tree's stream)";
  gca_status_t st = gca_stream_synchronize(ts);
  if (st != GCA_OK) {
    settle(ts);
    return st;
  }
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      *ok = part_fail(
          ctx,
          "CORRUPTION in a graph tree's output at %p (%zu words, generator offset %" PRIu64
          "): word %zu = 0x%08x, the same draws made eagerly give 0x%08x",
          out[0], n, offset, i, got[i], want[i]);
      return GCA_OK;
    }
  *what = "gca_graph_tree_step";
  return gca_graph_tree_step(t);
}

static bool part_tree(stress_part_ctx_t *ctx) {
  stress_rng_t *rng = ctx->rng;
  size_t n = 64 + (size_t)gca__stress_rng_below(rng, TREE_WORDS_MAX - 63);
  int steps = TREE_STEPS_MIN + (int)gca__stress_rng_below(rng, 3);
  uint64_t seed = gca__stress_rng_next(rng);
  gca_graph_tree_t *t = NULL;
  gca_graph_rng_t *g = NULL, *ref = NULL;
  gca_graph_fn_t *fn = NULL;
  gca_stream_t ts = NULL;
  void *x[2] = {NULL, NULL}, *r = NULL;
  bool ok = true;
  const char *what = "";
  gca_status_t st;
  uint32_t *got = malloc(n * 4), *want = malloc(n * 4);
  if (!got || !want) {
    free(got);
    free(want);
    return part_fail(ctx, "out of host memory for a graph tree's output");
  }
  tree_fn_ctx_t f = {.n = n};
  gca_graph_input_t input = {GCA_GRAPH_INPUT_STATIC, n * 4};
  size_t out_bytes = n * 4;
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "stress";
  d.body = tree_body;
  d.ctx = &f;
  d.ninputs = 1;
  d.inputs = &input;
  d.noutputs = 1;
  d.output_bytes = &out_bytes;

  STEP("gca_graph_tree_create", gca_graph_tree_create(0, NULL, &t));
  STEP("gca_graph_tree_stream", gca_graph_tree_stream(t, &ts));
  STEP("gca_graph_rng_create", gca_graph_rng_create(t, seed, &g));
  STEP("gca_graph_rng_create", gca_graph_rng_create(t, seed, &ref));
  f.rng = g;
  STEP("gca_graph_fn_register", gca_graph_fn_register(t, &d, &fn));
  for (int k = 0; k < 2; k++) {
    STEP("gca_malloc (a tree's input)", gca_malloc(&x[k], n * 4, ts));
    STEP("gca_kernel_fill_u32 (a tree's input)",
         gca_kernel_fill_u32(x[k], (uint32_t)gca__stress_rng_next(rng),
                             (uint32_t)gca__stress_rng_next(rng), n, ts));
  }
  STEP("gca_malloc (the reference)", gca_malloc(&r, n * 4, ts));
  /* warm-up, record, replay, then the static input moves: an update */
  for (int i = 0; i < steps && ok; i++) {
    STEP(what,
         tree_step_check(ctx, t, fn, g, ref, x[i >= TREE_MOVE_AT], r, n, got, want, &what, &ok));
    ctx->c->tree_steps_checked += ok;
  }
  if (ok) {
    gca_graph_stats_t gs = {.size = sizeof(gs)};
    STEP("gca_graph_tree_stats", gca_graph_tree_stats(t, &gs));
    ctx->c->tree_rounds++;
    ctx->c->tree_updates += gs.updates;
  }
  goto out;

failed:
  ok = step_failed(ctx, what, st, &ctx->c->tree_aborted);
out:
  settle(ts);
  ok = release(ctx, r) && ok;
  ok = release(ctx, x[0]) && ok;
  ok = release(ctx, x[1]) && ok;
  if (t)
    RETRY(gca_graph_tree_destroy(t));
  free(got);
  free(want);
  return ok;
}

/* ---- the rest of the device API ---- */

#define MISC_BYTES 256

static void host_fn_ran(void *flag) {
  __atomic_store_n((int *)flag, 1, __ATOMIC_RELEASE);
}

/* The compute kernels on small integers, whose every sum is exact in f32, so
 * the host's answer is the device's in any order: C = A . B (4x3 . 3x5), then
 * C += A2^T . B2^T from the same data read as 3x4 and 5x3, D = relu(C),
 * D += 2 C, D = dropout(D) * 0.5 with words from gca_kernel_fill_u32, and
 * dot = 0.25 * D . D. The block holds A (12), B (15), C, D, the words (20
 * each) and dot. */
enum { CM = 4, CK = 3, CN = 5, COMPUTE_FLOATS = CM * CK + CK * CN + 3 * CM * CN + 1 };

static float small_int(uint32_t value, size_t i) {
  return (float)((int)((value >> (i % 29)) & 7u) - 3);
}

static gca_status_t misc_compute(stress_part_ctx_t *ctx, gca_stream_t s, float *dev, uint32_t value,
                                 const char **what, bool *ok) {
  float a[CM * CK], b[CK * CN], c[CM * CN], d[CM * CN], got[CM * CN + 1], dot = 0;
  uint32_t words[CM * CN];
  for (size_t i = 0; i < CM * CK; i++)
    a[i] = small_int(value, i);
  for (size_t i = 0; i < CK * CN; i++)
    b[i] = small_int(value, i + 7);
  uint32_t step = value | 1u, cut = value ^ 0x9e3779b9u;
  for (size_t i = 0; i < CM; i++)
    for (size_t j = 0; j < CN; j++) {
      float sum = 0, sum_t = 0;
      for (size_t p = 0; p < CK; p++) {
        sum += a[i * CK + p] * b[p * CN + j];   /* A . B */
        sum_t += a[p * CM + i] * b[j * CK + p]; /* A2^T . B2^T */
      }
      size_t at = i * CN + j;
      c[at] = sum + sum_t;
      words[at] = value + (uint32_t)at * step;
      d[at] = words[at] < cut ? 0.0f : ((c[at] > 0 ? c[at] : 0) + 2 * c[at]) * 0.5f;
      dot += d[at] * d[at];
    }
  dot *= 0.25f;
  float *da = dev, *db = da + CM * CK, *dc = db + CK * CN, *dd = dc + CM * CN;
  uint32_t *dw = (uint32_t *)(dd + CM * CN);
  float *ddot = (float *)(dw + CM * CN);
  *what = "gca_memcpy (the compute kernels' inputs)";
  TOOL_CHECK(gca_memcpy(da, a, sizeof(a)));
  TOOL_CHECK(gca_memcpy(db, b, sizeof(b)));
  *what = "gca_kernel_gemm_f32";
  TOOL_CHECK(gca_kernel_gemm_f32(dc, da, db, CM, CN, CK, 0, s));
  TOOL_CHECK(gca_kernel_gemm_f32(dc, da, db, CM, CN, CK,
                                 GCA_GEMM_TRANS_A | GCA_GEMM_TRANS_B | GCA_GEMM_ACCUMULATE, s));
  *what = "gca_kernel_fill_u32";
  TOOL_CHECK(gca_kernel_fill_u32(dw, value, step, CM * CN, s));
  *what = "gca_kernel_ew_f32";
  TOOL_CHECK(gca_kernel_ew_f32(GCA_EW_RELU, dd, dc, NULL, 0, 0, CM * CN, s));
  TOOL_CHECK(gca_kernel_ew_f32(GCA_EW_AXPY, dd, dd, dc, 2.0f, 0, CM * CN, s));
  TOOL_CHECK(gca_kernel_ew_f32(GCA_EW_DROPOUT, dd, dd, dw, 0.5f, cut, CM * CN, s));
  *what = "gca_kernel_dot_f32";
  TOOL_CHECK(gca_kernel_dot_f32(ddot, dd, dd, CM * CN, 0.25f, s));
  *what = "gca_stream_synchronize";
  TOOL_CHECK(gca_stream_synchronize(s));
  *what = "gca_memcpy (the compute kernels' results)";
  TOOL_CHECK(gca_memcpy(got, dd, sizeof(d)));
  TOOL_CHECK(gca_memcpy(&got[CM * CN], ddot, sizeof(float)));
  for (size_t i = 0; i <= CM * CN; i++) {
    float want = i < CM * CN ? d[i] : dot;
    if (got[i] != want) {
      *ok =
          part_fail(ctx,
                    "CORRUPTION in the compute kernels on the block at %p: %s %zu is %g, "
                    "expected %g",
                    (void *)dev, i < CM * CN ? "element" : "dot", i, (double)got[i], (double)want);
      return GCA_OK;
    }
  }
  return GCA_OK;
}

bool gca__stress_part_misc(stress_part_ctx_t *ctx) {
  int ndev = 0, dev = 0;
  char name[128];
  size_t free_bytes, total_bytes;
  gca_stream_t s = NULL;
  gca_event_t e1 = NULL, e2 = NULL;
  void *p = NULL, *q = NULL, *table = NULL, *f = NULL;
  int flag = 0;
  uint8_t host[MISC_BYTES];
  uint32_t value = (uint32_t)gca__stress_rng_next(ctx->rng);
  bool ok = true, queued = false;
  const char *what = "";
  gca_status_t st;
  float ms = -1;

  STEP("gca_device_count", gca_device_count(&ndev));
  STEP("gca_device_name", gca_device_name(0, name, sizeof(name)));
  STEP("gca_mem_get_info", gca_mem_get_info(&free_bytes, &total_bytes));
  STEP("gca_get_device", gca_get_device(&dev));
  STEP("gca_set_device", gca_set_device(dev));
  if (ndev > 1) {
    st = gca_enable_peer_access(0, 1);
    if (st != GCA_OK && st != GCA_ERR_NOT_SUPPORTED)
      STEP("gca_enable_peer_access", st);
  }
  STEP("gca_stream_create", gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  STEP("gca_event_create", gca_event_create(&e1, GCA_EVENT_DEFAULT));
  STEP("gca_event_create", gca_event_create(&e2, GCA_EVENT_BLOCKING_SYNC));
  /* allocated on the part's stream, used on s, which is synchronized before
   * the free (so no record_stream is needed) and then destroyed */
  STEP("gca_malloc", gca_malloc(&p, MISC_BYTES, ctx->stream));
  queued = true;
  STEP("gca_event_record", gca_event_record(e1, s));
  STEP("gca_memset_d8_async", gca_memset_d8_async(p, 0xab, MISC_BYTES / 2, s));
  STEP("gca_memset_d32_async",
       gca_memset_d32_async((char *)p + MISC_BYTES / 2, value, MISC_BYTES / 8, s));
  STEP("gca_kernel_sleep", gca_kernel_sleep(1000, s));
  STEP("gca_launch_host_func", gca_launch_host_func(s, host_fn_ran, &flag));
  STEP("gca_event_record", gca_event_record(e2, s));
  st = gca_stream_query(s);
  if (st != GCA_ERR_NOT_READY)
    STEP("gca_stream_query", st);
  st = gca_event_query(e2);
  if (st != GCA_ERR_NOT_READY)
    STEP("gca_event_query", st);
  STEP("gca_event_synchronize", gca_event_synchronize(e2));
  STEP("gca_event_elapsed_time", gca_event_elapsed_time(&ms, e1, e2));
  if (!(ms >= 0) || !__atomic_load_n(&flag, __ATOMIC_ACQUIRE)) {
    ok = part_fail(ctx,
                   "after gca_event_synchronize the host function %s and the elapsed time is "
                   "%g ms",
                   flag ? "ran" : "did not run", (double)ms);
    goto out;
  }
  STEP("gca_memcpy", gca_memcpy(host, p, MISC_BYTES));
  for (size_t i = 0; i < MISC_BYTES; i++) {
    uint32_t word;
    memcpy(&word, host + (i & ~(size_t)3), 4);
    if (i < MISC_BYTES / 2 ? host[i] != 0xab : word != value) {
      ok = part_fail(ctx, "CORRUPTION after memsets on the block at %p: byte %zu is 0x%02x", p, i,
                     host[i]);
      goto out;
    }
  }
  /* a copy batch swaps the halves into q: its table lives in device memory */
  gca_copy_entry_t swap[2] = {{0, 0, MISC_BYTES / 2}, {0, 0, MISC_BYTES / 2}};
  STEP("gca_malloc", gca_malloc(&q, MISC_BYTES, ctx->stream));
  STEP("gca_malloc", gca_malloc(&table, sizeof(swap), ctx->stream));
  swap[0].dst = (uint64_t)(uintptr_t)q;
  swap[0].src = (uint64_t)(uintptr_t)p + MISC_BYTES / 2;
  swap[1].dst = (uint64_t)(uintptr_t)q + MISC_BYTES / 2;
  swap[1].src = (uint64_t)(uintptr_t)p;
  STEP("gca_memcpy", gca_memcpy(table, swap, sizeof(swap)));
  STEP("gca_kernel_copy_batch", gca_kernel_copy_batch(table, 2, s));
  STEP("gca_stream_synchronize", gca_stream_synchronize(s));
  STEP("gca_memcpy", gca_memcpy(host, q, MISC_BYTES));
  for (size_t i = 0; i < MISC_BYTES; i++) {
    uint32_t word;
    memcpy(&word, host + (i & ~(size_t)3), 4);
    if (i < MISC_BYTES / 2 ? word != value : host[i] != 0xab) {
      ok = part_fail(ctx, "CORRUPTION after a copy batch into the block at %p: byte %zu is 0x%02x",
                     q, i, host[i]);
      goto out;
    }
  }
  STEP("gca_malloc", gca_malloc(&f, COMPUTE_FLOATS * sizeof(float), ctx->stream));
  if ((st = misc_compute(ctx, s, f, value, &what, &ok)) != GCA_OK)
    goto failed;
  if (!ok)
    goto out;
  STEP("gca_memset_d8", gca_memset_d8(p, 0, MISC_BYTES));
  STEP("gca_memset_d32", gca_memset_d32(p, value, MISC_BYTES / 4));
  ctx->c->misc_rounds++;
  goto out;

failed:
  ok = step_failed(ctx, what, st, &ctx->c->misc_aborted);
out:
  if (queued)
    settle(s);
  ok = release(ctx, p) && ok;
  ok = release(ctx, q) && ok;
  ok = release(ctx, table) && ok;
  ok = release(ctx, f) && ok;
  if (e2)
    RETRY(gca_event_destroy(e2));
  if (e1)
    RETRY(gca_event_destroy(e1));
  if (s)
    RETRY(gca_stream_destroy(s));
  return ok;
}

/* Note [Captures and device synchronization]: synchronizing a device while
 * another thread captures one of its streams fails and invalidates that
 * capture, on the driver as on the sim, and the allocator cannot know of a
 * capture until the capturing thread routes it to a pool (a window after
 * stream_begin_capture). So the episodes that capture (capture, graph trees)
 * hold this lock shared, and those whose work synchronizes the device (a
 * pool's suspend and resume; stream churn, whose frees of a destroyed
 * stream's blocks wait for the device) hold it exclusively. */
static pthread_rwlock_t capture_lock = PTHREAD_RWLOCK_INITIALIZER;

void gca__stress_device_sync_begin(void) {
  pthread_rwlock_wrlock(&capture_lock);
}

void gca__stress_device_sync_end(void) {
  pthread_rwlock_unlock(&capture_lock);
}

bool gca__stress_part_capture(stress_part_ctx_t *ctx) {
  pthread_rwlock_rdlock(&capture_lock);
  bool ok = part_capture(ctx);
  pthread_rwlock_unlock(&capture_lock);
  return ok;
}

bool gca__stress_part_tree(stress_part_ctx_t *ctx) {
  pthread_rwlock_rdlock(&capture_lock);
  bool ok = part_tree(ctx);
  pthread_rwlock_unlock(&capture_lock);
  return ok;
}

bool gca__stress_part_suspend(stress_part_ctx_t *ctx) {
  gca__stress_device_sync_begin();
  bool ok = part_suspend(ctx);
  gca__stress_device_sync_end();
  return ok;
}

bool gca__stress_parts_finish(stress_part_ctx_t *ctx) {
  bool ok = true;
  for (size_t i = 0; i < ctx->nunclosed; i++) {
    gca_status_t st = gca_ipc_close(ctx->unclosed[i]);
    if (st != GCA_OK && ok)
      ok = part_fail(ctx, "gca_ipc_close(%p) failed after the run: %s: %s", ctx->unclosed[i],
                     gca_status_name(st), gca_last_error());
  }
  for (size_t i = 0; i < ctx->ndeferred; i++) {
    gca_status_t st = gca_free(ctx->deferred[i]);
    if (st != GCA_OK && ok)
      ok = part_fail(ctx, "gca_free(%p) failed after the run: %s: %s", ctx->deferred[i],
                     gca_status_name(st), gca_last_error());
  }
  free(ctx->unclosed);
  free(ctx->deferred);
  ctx->unclosed = NULL;
  ctx->deferred = NULL;
  ctx->nunclosed = ctx->ndeferred = 0;
  return ok;
}
