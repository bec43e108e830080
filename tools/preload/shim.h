/* SPDX-License-Identifier: Apache-2.0 */
/* shim.h - what the parts of libgca_preload.so share (preload.c, capture.c). */
#ifndef GCA_PRELOAD_SHIM_H
#define GCA_PRELOAD_SHIM_H

#include <stdbool.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#define SHIM_API __attribute__((visibility("default")))

/* True when the shim serves the runtime itself (sim backend). */
bool gca__shim_on_sim(void);

/* The next definition of `name` after this library (libcudart, libcuda; for
 * a driver name, the driver library's, Note [Finding the driver]), looked up
 * once into *slot; NULL when the process has none. */
void *gca__shim_real(const char *name, void **slot);

#define REAL(fn)                                  \
  ({                                              \
    static void *slot_;                           \
    (__typeof__(&fn))gca__shim_real(#fn, &slot_); \
  })

/* Sets the calling thread's last runtime error (cudaGetLastError). */
cudaError_t gca__shim_rt_error(cudaError_t e);

/* Note [Captures under the shim] (capture.c): a stream the program destroys
 * ends the captures the shim counted on it. */
void gca__shim_capture_forget(CUstream stream);

#endif
