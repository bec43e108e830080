/* SPDX-License-Identifier: Apache-2.0 */
/* ctor_lib.c - a library whose constructor allocates through the CUDA runtime
 * before main() runs, as some libraries do at load time: under the preload
 * shim that allocation must be served (Note [Preload initialization]).
 *
 * The constructor acts only when CUDART_USER_CTOR=1; preload_ctor_result()
 * then says 1 (allocated, stamped, read back, freed) or a negative step. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

__attribute__((visibility("default"))) int preload_ctor_result(void);

static int ctor_result;

__attribute__((constructor)) static void allocate_at_load(void) {
  const char *on = getenv("CUDART_USER_CTOR");
  if (!on || strcmp(on, "1") != 0)
    return;
  void *p = NULL;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess || p == NULL) {
    ctor_result = -1;
    return;
  }
  uint8_t back[64];
  if (cudaMemset(p, 0x5a, 1 << 20) != cudaSuccess ||
      cudaMemcpy(back, p, sizeof(back), cudaMemcpyDeviceToHost) != cudaSuccess) {
    ctor_result = -2;
    return;
  }
  for (size_t i = 0; i < sizeof(back); i++)
    if (back[i] != 0x5a) {
      ctor_result = -3;
      return;
    }
  ctor_result = cudaFree(p) == cudaSuccess ? 1 : -4;
}

int preload_ctor_result(void) {
  return ctor_result;
}
