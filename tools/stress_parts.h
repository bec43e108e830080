/* SPDX-License-Identifier: Apache-2.0 */
/* stress_parts.h - gca-stress's workload parts beyond allocate and free: a
 * capture into a private pool replayed and checked, checkpoint and restore of
 * that pool, a block exported and imported through IPC and read back through
 * the import, suspend and resume of a private pool with stamped blocks, and
 * a round of the device API's remaining calls.
 *
 * The one idea: each part is a self-contained episode on the calling thread
 * that checks what it computed (graph results, stamps through an import or
 * after a resume) and always ends with what it created destroyed or handed
 * over to be freed at the end, whether or not an injected fault cut it short.
 * A tool op that fails while faults are injected is counted and the episode
 * winds down; without faults it is a failure of the run. A wrong value is a
 * failure in both cases.
 */
#ifndef GCA_TOOLS_STRESS_PARTS_H
#define GCA_TOOLS_STRESS_PARTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca.h"
#include "stress_sizes.h"
#include "stress_stamp.h"

/* Per-thread counts of what the parts did (all uint64_t: summed as an array). */
typedef struct stress_part_counters {
  uint64_t churns;          /* streams destroyed and re-created */
  uint64_t churns_live;     /* ... without synchronizing first (work and blocks still on it) */
  uint64_t churn_aborted;   /* an injected fault kept the old stream */
  uint64_t captures;        /* graphs captured into a private pool and instantiated */
  uint64_t capture_aborted; /* an injected fault or a full device ended it */
  uint64_t replays_checked;
  uint64_t restores_checked;
  uint64_t ipc_checked; /* stamps read back through an import */
  uint64_t ipc_not_supported;
  uint64_t ipc_fabric_checked;       /* ... of them through fabric handles */
  uint64_t ipc_fabric_not_supported; /* fabric export refused: fell back to fds */
  uint64_t ipc_aborted;
  uint64_t ipc_close_dropped; /* a failed close that forgot the import anyway */
  uint64_t suspends_checked;  /* stamps read back after suspend and resume */
  uint64_t suspend_refused;   /* not expandable, or a capture under way */
  uint64_t suspend_aborted;
  uint64_t misc_rounds;
  uint64_t misc_aborted;
  uint64_t tree_rounds;        /* graph-tree episodes that checked every step */
  uint64_t tree_steps_checked; /* outputs checked against eager draws */
  uint64_t tree_updates;       /* exec updates the trees made */
  uint64_t tree_aborted;
  uint64_t deferred;           /* frees and closes that failed, retried after the run */
  uint64_t host_rounds;        /* pinned host episodes that checked their copy */
  uint64_t host_aborted;       /* ... cut short by an injected fault */
  uint64_t host_not_supported; /* gca_host_alloc without jemalloc: registered buffers only */
} stress_part_counters_t;

/* What a part needs from the run: set up by gca-stress per thread. */
typedef struct stress_part_ctx {
  uint64_t key;        /* stamps' keys derive from it */
  gca_stream_t stream; /* the thread's own stream for the parts' allocations */
  bool faults;         /* injected faults are armed */
  stress_rng_t *rng;
  stress_part_counters_t *c;
  uint32_t *scratch; /* STRESS_STAMP_MAX_WORDS words */
  char fail[1024];   /* set when a part returns false */
  void **deferred;   /* device pointers whose gca_free failed */
  size_t ndeferred, capdeferred;
  void **unclosed; /* IPC imports whose gca_ipc_close failed */
  size_t nunclosed, capunclosed;
} stress_part_ctx_t;

/* ---- stress_parts.c ---- */

/* Each part returns false (ctx->fail set) when the run must fail: a wrong
 * value, or a failed op while no fault is injected. */
bool gca__stress_part_capture(stress_part_ctx_t *ctx);
/* Exports the live block at ptr (stamped as `stamp`, last written on
 * `stream`), passes the handle over a socket pair, opens it and checks the
 * stamp through the import. */
bool gca__stress_part_ipc(stress_part_ctx_t *ctx, gca_devptr_t ptr, const stress_stamp_t *stamp,
                          gca_stream_t stream);
bool gca__stress_part_suspend(stress_part_ctx_t *ctx);
bool gca__stress_part_misc(stress_part_ctx_t *ctx);
/* Runs a function that draws from the graph-safe RNG through a graph tree
 * for several steps (warm-up, record, replays; a static input moves, so the
 * tree updates the recording) and checks every output against the same draws
 * made eagerly. */
bool gca__stress_part_tree(stress_part_ctx_t *ctx);
/* ---- stress_host.c ---- */

/* Pinned host memory: a deferred free of a block a copy uses, a read back
 * through pinned memory, a registered buffer, now and then empty_cache. */
bool gca__stress_part_host(stress_part_ctx_t *ctx);

/* Bracket work that synchronizes the device, which must not overlap another
 * thread's capture (Note [Captures and device synchronization]). */
void gca__stress_device_sync_begin(void);
void gca__stress_device_sync_end(void);
/* Frees and closes what the parts deferred (after faults are cleared);
 * false with ctx->fail set when one still fails. */
bool gca__stress_parts_finish(stress_part_ctx_t *ctx);

#endif
