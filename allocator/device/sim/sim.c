/* sim.c - the sim backend (being written). */
#include "device.h"

static gca_status_t sim_init(void) {
  return gca__error(GCA_ERR_NOT_SUPPORTED, "init: sim backend not yet built");
}
static const gca_device_ops_t sim_ops = {.name = "sim", .init = sim_init};
const gca_device_ops_t *gca__sim_ops(void) {
  return &sim_ops;
}
