/* sim_graph.c - (being written) stream capture and graphs. */
#include "sim.h"

void gca__sim_graph_ops(gca_device_ops_t *ops) {
  (void)ops;
}

gca_status_t gca__sim_capture_check_unsafe(const char *op) {
  (void)op;
  return GCA_OK;
}
