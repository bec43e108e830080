/* SPDX-License-Identifier: Apache-2.0 */
/* bench_procs.h - gca-bench's process ceiling (bench_procs.c): the 1-thread
 * pair loop run in independent processes at once.
 *
 * Two threads of one process can lose throughput to what they share (a cache
 * line written by both, a lock); two processes share nothing of gca's. So the
 * same loop in one process alone, then in two processes at once, gives what
 * this machine lets two copies of it reach (on a 2-core VM whose cores slow
 * when both run, well under 2x), measured in the same round as the thread
 * rows. The partners are the benchmark itself, run again as `gca-bench
 * --partner` with a socket on their standard input and output
 * (GCA_BENCH_PARTNER names another program instead: the tests' way to make
 * a partner fail), on the backend the benchmark chose.
 *
 * The protocol, a line each way: the benchmark sends "run S"; the partner
 * warms up and answers "ready"; "go" starts its window of S seconds, after
 * which it answers "ns X" (ns per pair) or "error TEXT". End of input ends it.
 */
#ifndef GCA_TOOLS_BENCH_PROCS_H
#define GCA_TOOLS_BENCH_PROCS_H

#include <stdbool.h>
#include <sys/types.h>

#include "gca.h"

#define BENCH_PROCS 2
/* How long past four of its windows (its warm-up) a partner may stay silent
 * before it is taken as failed. */
#define BENCH_PROCS_GRACE_MS 60000

typedef struct bench_procs {
  int n; /* partners started */
  pid_t pid[BENCH_PROCS];
  int fd[BENCH_PROCS]; /* the benchmark's end of each partner's socket */
  int grace_ms;        /* BENCH_PROCS_GRACE_MS from start; a test may set less */
  char why[256];       /* why the figure is missing, when it is */
} bench_procs_t;

/* Starts the partners on `backend` (gca_device_backend_name's). False, with
 * bp->why set and nothing left running, when one cannot be started. */
bool bench_procs_start(bench_procs_t *bp, const char *backend);

/* One round: the first partner alone, then all at once, windows of `seconds`;
 * *alone_ns and both_ns[i] are ns per pair of each window. False, with
 * bp->why set and the partners stopped, when one fails or answers out of turn. */
bool bench_procs_round(bench_procs_t *bp, double seconds, double *alone_ns,
                       double both_ns[BENCH_PROCS]);

/* Ends the partners (their input closed) and waits for them. Idempotent. */
void bench_procs_stop(bench_procs_t *bp);

/* A partner's side, on standard input and output: prepare warms up before
 * "ready" (it may keep state in ctx), window runs the timed window. Returns the
 * process's exit status. */
typedef struct bench_partner_ops {
  gca_status_t (*prepare)(void *ctx, double seconds);
  gca_status_t (*window)(void *ctx, double seconds, double *ns);
} bench_partner_ops_t;

int bench_partner_serve(const bench_partner_ops_t *ops, void *ctx);

#endif
