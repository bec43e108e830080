/* sim_stream.c - (being written) streams, events, host funcs, copies, kernels. */
#include "sim.h"

void gca__sim_stream_ops(gca_device_ops_t *ops) {
  (void)ops;
}
