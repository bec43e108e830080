/* SPDX-License-Identifier: Apache-2.0 */
/* fake_cudart.c - the few CUDA runtime entry points libgca_preload.so
 * forwards to on the cuda backend, for fake_user (which links this library
 * where a real program links libcudart): the frees a program makes of memory
 * gca does not hold, the current device, and the last error.
 *
 * The one idea: record what reached the runtime and answer as the real one
 * answered on the H200 when the shim handed it a pointer of gca's segment:
 * cudaSuccess. A free the shim should have refused and forwarded instead
 * shows up both in the count and in the result the program sees.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

static int frees, host_frees;
static void *last_free;

EXPORT cudaError_t cudaGetDevice(int *device) {
  if (device == NULL)
    return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *devPtr) {
  frees++;
  last_free = devPtr;
  return cudaSuccess;
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  (void)hStream;
  return cudaFree(devPtr);
}

EXPORT cudaError_t cudaFreeHost(void *ptr) {
  host_frees++;
  last_free = ptr;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}

EXPORT cudaError_t cudaPeekAtLastError(void) {
  return cudaSuccess;
}

/* ---- inspection ---- */

EXPORT int fake_cudart_frees(void);
EXPORT int fake_cudart_host_frees(void);
EXPORT void *fake_cudart_last_free(void);

/* Calls of cudaFree / cudaFreeAsync, of cudaFreeHost, and the pointer the
 * last of them was given. */
EXPORT int fake_cudart_frees(void) {
  return frees;
}
EXPORT int fake_cudart_host_frees(void) {
  return host_frees;
}
EXPORT void *fake_cudart_last_free(void) {
  return last_free;
}
