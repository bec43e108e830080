/* SPDX-License-Identifier: Apache-2.0 */
/* stress_host.c - gca-stress's pinned host memory episode: a stamped block
 * from gca_host_alloc copied to the device on the part's stream, recorded on
 * it and freed while the copy may still run (a deferred free), read back into
 * a second pinned block and checked; a caller-owned buffer registered with
 * gca_host_register, copied from, unregistered; now and then
 * gca_host_empty_cache, which gives pinned extents back to the device layer.
 *
 * Episodes run one at a time (host_lock), so that an episode's empty_cache
 * finds the allocator idle and destroys the arena: every host op of the
 * device layer (host_alloc, host_free, host_register, host_unregister) is
 * reached while faults are injected.
 *
 * The one idea, as for the other parts (stress_parts.h): the episode checks
 * what it computed and always winds down, retrying the frees and unregisters
 * an injected fault refused, so the run's leak check still holds.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stress_parts.h"

#define HOST_RETRIES 16

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;

static uint8_t pattern(uint64_t key, size_t i) {
  return (uint8_t)((key >> (8 * (i % 8))) ^ (i * 13u));
}

/* A step failed: counted in host_aborted while faults are injected or when
 * memory ran out (the device full of the workers' blocks, as their own
 * requests' out-of-memory is counted), else a failure of the run. */
static bool failed(stress_part_ctx_t *ctx, const char *what, gca_status_t st) {
  if (ctx->faults || st == GCA_ERR_OUT_OF_MEMORY) {
    ctx->c->host_aborted++;
    return true;
  }
  snprintf(ctx->fail, sizeof(ctx->fail), "%s failed: %s: %s", what, gca_status_name(st),
           gca_last_error());
  return false;
}

/* Retries a cleanup call an injected fault refused; false (ctx->fail) if it never succeeds. */
#define CLEANUP(ctx, what, call)                                                               \
  do {                                                                                         \
    gca_status_t cst_ = GCA_OK;                                                                \
    for (int r_ = 0; r_ < HOST_RETRIES && (cst_ = (call)) != GCA_OK; r_++) {                   \
    }                                                                                          \
    if (cst_ != GCA_OK && ok) {                                                                \
      snprintf((ctx)->fail, sizeof((ctx)->fail), "%s failed %d times: %s", what, HOST_RETRIES, \
               gca_last_error());                                                              \
      ok = false;                                                                              \
    }                                                                                          \
  } while (0)

static bool episode(stress_part_ctx_t *ctx);

bool gca__stress_part_host(stress_part_ctx_t *ctx) {
  pthread_mutex_lock(&host_lock);
  bool ok = episode(ctx);
  pthread_mutex_unlock(&host_lock);
  return ok;
}

static bool episode(stress_part_ctx_t *ctx) {
  size_t size = 64 + (size_t)(gca__stress_rng_next(ctx->rng) % (256u * 1024u));
  uint64_t key = gca__stress_rng_next(ctx->rng);
  uint8_t *a = NULL, *b = NULL, *reg = NULL;
  void *d = NULL;
  bool ok = true, registered = false;
  gca_status_t st;
  const char *what = "";
#define H_STEP(name, call)       \
  do {                           \
    what = (name);               \
    if ((st = (call)) != GCA_OK) \
      goto fail;                 \
  } while (0)

  st = gca_host_alloc((void **)&a, size);
  if (st == GCA_ERR_NOT_SUPPORTED) { /* no jemalloc: the registered buffer only */
    ctx->c->host_not_supported++;
    H_STEP("gca_malloc", gca_malloc(&d, size, ctx->stream));
    goto registered_part;
  }
  H_STEP("gca_host_alloc", st);
  for (size_t i = 0; i < size; i++)
    a[i] = pattern(key, i);
  H_STEP("gca_malloc", gca_malloc(&d, size, ctx->stream));
  H_STEP("gca_memcpy_async", gca_memcpy_async(d, a, size, ctx->stream));
  H_STEP("gca_host_record_stream", gca_host_record_stream(a, ctx->stream));
  H_STEP("gca_host_free", gca_host_free(a)); /* deferred until the copy ran */
  a = NULL;
  H_STEP("gca_host_alloc", gca_host_alloc((void **)&b, size));
  memset(b, 0, size);
  H_STEP("gca_memcpy_async", gca_memcpy_async(b, d, size, ctx->stream));
  H_STEP("gca_stream_synchronize", gca_stream_synchronize(ctx->stream));
  for (size_t i = 0; i < size; i++)
    if (b[i] != pattern(key, i)) {
      snprintf(ctx->fail, sizeof(ctx->fail),
               "CORRUPTION through pinned host memory: byte %zu of %zu is 0x%02x, wanted 0x%02x", i,
               size, b[i], pattern(key, i));
      ok = false;
      goto out;
    }
registered_part:
  reg = aligned_alloc(4096, 8192);
  if (!reg) {
    snprintf(ctx->fail, sizeof(ctx->fail), "out of host memory for a registered buffer");
    ok = false;
    goto out;
  }
  memset(reg, 0x5a, 8192);
  H_STEP("gca_host_register", gca_host_register(reg, 8192));
  registered = true;
  H_STEP("gca_memcpy_async", gca_memcpy_async(d, reg, size < 8192 ? size : 8192, ctx->stream));
  H_STEP("gca_stream_synchronize", gca_stream_synchronize(ctx->stream));
  ctx->c->host_rounds++;
  goto out;
fail:
  ok = failed(ctx, what, st);
out:
  CLEANUP(ctx, "gca_stream_synchronize", gca_stream_synchronize(ctx->stream));
  if (registered)
    CLEANUP(ctx, "gca_host_unregister", gca_host_unregister(reg));
  free(reg);
  if (a)
    CLEANUP(ctx, "gca_host_free", gca_host_free(a));
  if (b)
    CLEANUP(ctx, "gca_host_free", gca_host_free(b));
  if (d)
    CLEANUP(ctx, "gca_free", gca_free(d));
  if (key % 4 == 0 && (st = gca_host_empty_cache()) != GCA_OK && st != GCA_ERR_NOT_SUPPORTED && ok)
    ok = failed(ctx, "gca_host_empty_cache", st);
  return ok;
#undef H_STEP
}
