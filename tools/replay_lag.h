/* SPDX-License-Identifier: Apache-2.0 */
/* replay_lag.h - gca-replay --lag: streams that run behind the host
 * (replay_lag.c). One replay at a time. */
#ifndef GCA_REPLAY_LAG_H
#define GCA_REPLAY_LAG_H

#include <stddef.h>
#include <stdint.h>

#include "gca.h"

/* Starts a pass whose streams run n events behind the host. */
void replay_lag_start(uint64_t n);
/* After event i (0-based) of the pass, replayed on `stream`: the host's
 * progress, and every n / 4 events a wait queued on the stream. */
gca_status_t replay_lag_after(uint64_t i, gca_stream_t stream);
/* Ends the pass: lets every queued wait go, synchronizes the streams. */
gca_status_t replay_lag_drain(const gca_stream_t *streams, size_t nstreams);
/* Queued waits that gave up on the host (each: the host blocked on a stream). */
int64_t replay_lag_stalls(void);

#endif
