/* cuda.c - the CUDA driver backend (being written). */
#include "device.h"

static gca_status_t cuda_init(void) {
  return gca__error(GCA_ERR_NOT_SUPPORTED, "init: cuda backend not yet built");
}
static const gca_device_ops_t cuda_ops = {.name = "cuda", .init = cuda_init};
const gca_device_ops_t *gca__cuda_ops(void) {
  return &cuda_ops;
}
